"""A Great Expectations suite file, read and checked without importing GX.

``import great_expectations`` costs 3-7 s, so a source is checked when it loads (``collector
validate``, the start of a run) by reading the suite JSON here: every problem is one line naming
the file and the expectation, and every expectation is checked (:func:`suite_problems`), so a
user fixing a suite hears about each bad expectation at once. What only GX can
judge (kwargs types, run-time-only errors) is checked by :mod:`collector.settle.gx_runtime` on the
first validation.

* **Unknown expectation types are caught without importing GX**: the names are read from the
  installed package's ``great_expectations/expectations/core/__init__.py`` (found with
  ``importlib.util.find_spec``, which does not import the package); that file imports exactly
  the core expectations GX registers. If the file cannot be found or read, the check moves to
  the first validation (GX's registry), still as a ``ConfigError``. Custom or plugin
  expectations are therefore not supported.
* **Regexes are compiled and type names resolved here**: GX would only fail on them while
  validating data.
* **Type expectations are evaluated by Collector, per row, not by GX.**
  ``expect_column_values_to_be_of_type`` / ``_in_type_list`` in GX 1.24 check pandas
  object columns with ``isinstance(value, np.dtype(type_).type or native)``: ``"int64"`` then
  rejects every Python ``int`` (only ``numpy.int64`` matches), ``"float64"`` rejects Python
  floats, and ``"int"`` accepts ``True`` (``bool`` subclasses ``int``). For JSON data that is
  wrong, so this module maps each type name to a :class:`TypeRule`: Python and numpy names map
  to JSON-ish kinds (``int``/``int64``/``Int64``/``long`` -> integers but not booleans, sized and
  unsigned integers also range-checked; ``float``/``float64``/``double`` -> floats, not ints,
  as in GX; ``str``/``string``; ``bool``/``bool_``; ``list``; ``dict``; ``object`` -> anything);
  other names resolve like GX does (``np.dtype(name).type``, then pandas attributes). Their
  kwargs are still validated by GX, and ``row_condition`` on them is refused.
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from collector import _text
from collector.errors import ConfigError

__all__ = [
    "TYPE_EXPECTATIONS",
    "Spec",
    "Suite",
    "TypeRule",
    "check_suite_file",
    "check_suite_kwargs",
    "is_null",
    "kwargs_problems",
    "load_suite",
    "one_line",
    "show",
    "suite_problems",
]

TYPE_EXPECTATIONS = frozenset(
    {"expect_column_values_to_be_of_type", "expect_column_values_to_be_in_type_list"}
)
# Keys GX's ExpectationConfigurationSchema knows, plus the pre-1.0 spellings.
_EXPECTATION_KEYS = frozenset(
    {
        "type",
        "expectation_type",
        "kwargs",
        "meta",
        "notes",
        "id",
        "ge_cloud_id",
        "expectation_context",
        "rendered_content",
        "description",
        "severity",
    }
)


@dataclass(frozen=True, slots=True)
class TypeRule:
    """How one type name from a suite is checked against one non-null JSON value."""

    name: str
    matches: Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class Spec:
    """One expectation as read from the file; ``type_rules`` only for the two type checks."""

    position: int
    type: str
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    type_rules: tuple[TypeRule, ...] | None

    @property
    def where(self) -> str:
        return f"expectations[{self.position}] ({self.type})"


@dataclass(frozen=True, slots=True)
class Suite:
    path: Path
    name: str
    specs: tuple[Spec, ...]
    parameters: dict[str, Any]


def one_line(text: object, limit: int = 300) -> str:
    """A message (often a multi-line GX/pydantic text) on one line; spaces inside a line are
    kept (a value like ``'  tools '`` must show its spaces): :func:`collector._text.one_line`."""
    return _text.one_line(text, limit)


def show(value: object, limit: int = 60) -> str:
    """A short repr of a record value for messages."""
    try:
        text = _text.quoted(value)  # repr, except that a regex keeps its single backslashes
    except Exception:  # a hostile __repr__ must not break validation
        text = f"<{type(value).__name__}>"
    text = one_line(text, 1000)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@lru_cache(maxsize=1)
def _core_expectation_types() -> frozenset[str] | None:
    """Names of the expectations GX registers, read from its source without importing it.

    ``great_expectations/expectations/core/__init__.py`` imports exactly the core expectation
    modules, and each module is named like the expectation type. ``None`` means "could not
    tell", and the check then happens against GX's registry on the first validate().
    """
    try:
        spec = find_spec("great_expectations")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        init = Path(location) / "expectations" / "core" / "__init__.py"
        try:
            text = init.read_text(encoding="utf-8")
        except OSError:
            continue
        names = frozenset(re.findall(r"^from \.(\w+) import", text, flags=re.MULTILINE))
        if names:
            return names
    return None


def is_null(value: object) -> bool:
    """What pandas/GX treat as missing in an object column (JSON has only None and NaN)."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return type(value).__name__ in ("NAType", "NaTType")


def _is_numpy(value: object) -> bool:
    return type(value).__module__ == "numpy"


def _integer_rule(name: str, lo: int | None, hi: int | None) -> TypeRule:
    def matches(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return False  # JSON true/false is not an integer even though bool subclasses int
        number = int(value)
        return (lo is None or number >= lo) and (hi is None or number <= hi)

    return TypeRule(name, matches)


def _float_matches(value: Any) -> bool:
    if isinstance(value, float):
        return True
    return (
        _is_numpy(value)
        and isinstance(value, numbers.Real)
        and not isinstance(value, numbers.Integral)
    )


def _bool_matches(value: Any) -> bool:
    return isinstance(value, bool) or (_is_numpy(value) and type(value).__name__ == "bool")


def _instance_rule(name: str, *types: type) -> TypeRule:
    return TypeRule(name, lambda value: isinstance(value, types))


def _static_type_rule(name: str) -> TypeRule | None:
    """Rules for the type names JSON data can meet, without numpy; ``None`` if not one of them."""
    key = name.lower()
    sized = re.fullmatch(r"(u?)int(8|16|32|64)", key)
    if sized:
        bits = int(sized.group(2))
        if sized.group(1):
            return _integer_rule(name, 0, 2**bits - 1)
        return _integer_rule(name, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if key in ("int", "long", "integer", "int_", "intc", "intp", "longlong"):
        return _integer_rule(name, None, None)
    if key in ("uint", "uintc", "uintp", "ulonglong"):
        return _integer_rule(name, 0, None)
    if key in ("float", "double", "float_", "float16", "float32", "float64", "single", "half"):
        return TypeRule(name, _float_matches)
    if key in ("str", "string", "string_types", "unicode", "str_", "unicode_", "u"):
        return _instance_rule(name, str)
    if key in ("bool", "bool_", "boolean"):
        return TypeRule(name, _bool_matches)
    if key in ("object", "object_", "o"):
        return TypeRule(name, lambda value: True)
    if key == "list":
        return _instance_rule(name, list)
    if key == "dict":
        return _instance_rule(name, dict)
    if key in ("none", "nonetype"):
        return _instance_rule(name, type(None))
    if key in ("bytes", "bytes_", "s"):
        return _instance_rule(name, bytes)
    if key == "complex":
        return _instance_rule(name, complex)
    return None


def _type_rule(name: str) -> TypeRule | None:
    """Resolve a type name like GX does for pandas, with the JSON-friendly names first."""
    rule = _static_type_rule(name)
    if rule is not None:
        return rule
    import numpy as np  # only for unusual names such as "datetime64[ns]"

    found: list[type] = []
    try:
        found.append(np.dtype(name).type)
    except TypeError:
        import pandas as pd

        for holder in (pd, pd.core.dtypes.dtypes):
            candidate = getattr(holder, name, None)
            if isinstance(candidate, type):
                found.append(candidate)
    if not found:
        return None
    return _instance_rule(name, *found)


def _type_rules(
    path: Path, spec_where: str, kwargs: Mapping[str, Any], type_: str
) -> tuple[tuple[TypeRule, ...] | None, list[str]]:
    """The type rules of a type expectation, and every problem with them (one line each)."""
    if kwargs.get("row_condition") is not None:
        return None, [f"{path}: {spec_where}: row_condition is not supported on type expectations"]
    if type_ == "expect_column_values_to_be_of_type":
        wanted = kwargs.get("type_")
        if wanted is None:
            return None, []
        if not isinstance(wanted, str):
            return None, [f"{path}: {spec_where}: type_ must be a string, got {show(wanted)}"]
        names = [wanted]
    else:
        listed = kwargs.get("type_list")
        if listed is None:
            return None, []
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            problem = f"type_list must be a list of strings, got {show(listed)}"
            return None, [f"{path}: {spec_where}: {problem}"]
        names = listed
    rules, problems = [], []
    for name in names:
        rule = _type_rule(name)
        if rule is None:
            problems.append(f"{path}: {spec_where}: unknown type {name!r}")
        else:
            rules.append(rule)
    return tuple(rules), problems


def _regex_problems(path: Path, where: str, kwargs: Mapping[str, Any]) -> list[str]:
    """Compile regexes now: GX would only fail on them while validating data."""
    patterns: list[Any] = []
    if "regex" in kwargs:
        patterns.append(kwargs["regex"])
    if isinstance(kwargs.get("regex_list"), list):
        patterns.extend(kwargs["regex_list"])
    problems = []
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue  # GX's own kwargs check reports the wrong type on first validate()
        try:
            re.compile(pattern)
        except re.error as exc:
            problems.append(f"{path}: {where}: invalid regex {pattern!r}: {exc}")
    return problems


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: suite file not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{path}: suite path is a directory, not a JSON file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: suite file is not UTF-8 text") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read suite file: {exc.strerror or exc}") from exc


def _read_spec(
    path: Path, position: int, item: Any, known: frozenset[str] | None
) -> tuple[Spec | None, list[str]]:
    """One expectation and every problem found in it; a problem that hides the rest (not an
    object, no type) is the only one said."""
    where = f"expectations[{position}]"
    if not isinstance(item, dict):
        return None, [f"{path}: {where} is not an object"]
    type_ = item.get("type", item.get("expectation_type"))
    if type_ is None:
        return None, [f"{path}: {where} has no 'type'"]
    if not isinstance(type_, str):
        return None, [f"{path}: {where}: 'type' must be a string, got {show(type_)}"]
    problems = []
    if "type" in item and "expectation_type" in item and item["expectation_type"] != type_:
        problems.append(f"{path}: {where}: 'type' and 'expectation_type' disagree")
    where = f"{where} ({type_})"
    for unknown in sorted(set(item) - _EXPECTATION_KEYS):
        problems.append(f"{path}: {where}: unknown key {unknown!r}")
    if known is not None and type_ not in known:
        close = difflib.get_close_matches(type_, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"{path}: {where}: unknown expectation type{hint}")
    kwargs = item.get("kwargs")
    if kwargs is None:
        kwargs = {}
    meta = item.get("meta")
    if meta is None:
        meta = {}
    if not isinstance(kwargs, dict):
        problems.append(f"{path}: {where}: 'kwargs' must be an object")
    if not isinstance(meta, dict):
        problems.append(f"{path}: {where}: 'meta' must be an object")
    if problems and not isinstance(kwargs, dict):
        return None, problems
    problems += _regex_problems(path, where, kwargs)
    rules = None
    if type_ in TYPE_EXPECTATIONS:
        rules, found = _type_rules(path, where, kwargs, type_)
        problems += found
    if problems:
        return None, problems
    return Spec(position, type_, kwargs, meta, rules), []


def _read_suite(path: Path) -> tuple[Suite | None, list[str]]:
    """The suite, or every problem of the file (one line each, in file order).

    A file that is not a suite at all (unreadable, not JSON, no ``expectations`` list) has one
    problem; otherwise each expectation is checked, so a user fixing the file hears about every
    bad expectation at once, not one per attempt.
    """
    try:
        text = _read_text(path)
    except ConfigError as exc:
        return None, [str(exc)]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"]
    if not isinstance(data, dict):
        return None, [
            f"{path}: not an expectation suite: top level is a JSON {type(data).__name__}, "
            "expected an object with an 'expectations' list"
        ]
    expectations = data.get("expectations")
    if not isinstance(expectations, list):
        what = "no 'expectations' key" if expectations is None else "'expectations' is not a list"
        return None, [f"{path}: not an expectation suite: {what}"]
    problems = []
    name = data.get("name") or data.get("expectation_suite_name") or path.stem
    if not isinstance(name, str):
        problems.append(f"{path}: suite 'name' must be a string, got {show(name)}")
    parameters = data.get("suite_parameters") or {}
    if not isinstance(parameters, dict):
        problems.append(f"{path}: 'suite_parameters' must be an object")
    known = _core_expectation_types()
    specs = []
    for position, item in enumerate(expectations):
        spec, found = _read_spec(path, position, item, known)
        problems += found
        if spec is not None:
            specs.append(spec)
    if problems:
        return None, problems
    return Suite(path=path, name=name, specs=tuple(specs), parameters=parameters), []


def _first_of(problems: list[str]) -> ConfigError:
    """One ConfigError for code that stops at the first problem (the run's validator); it says
    how many more there are, and where to see them all."""
    more = len(problems) - 1
    tail = f" (and {more} more: `collector validate` lists them)" if more else ""
    return ConfigError(problems[0] + tail)


def suite_problems(suite_path: str | Path) -> list[str]:
    """Every problem of a suite file without GX, one line each naming the file and the
    expectation (``[]`` when it is fine): what a source's load reports."""
    return _read_suite(Path(suite_path))[1]


def load_suite(suite_path: str | Path) -> Suite:
    """Read and check a suite file without GX; its first problem is a one-line ConfigError."""
    suite, problems = _read_suite(Path(suite_path))
    if suite is None:
        raise _first_of(problems)
    return suite


def check_suite_file(path: str | Path) -> None:
    """Check a suite file cheaply (no GX import) so a bad config fails when a source loads.

    Raises :class:`ConfigError` with one line naming the file and the first problem (and how
    many more; :func:`suite_problems` gives them all). Kwargs errors that only GX can judge are
    reported by the first :meth:`SuiteValidator.validate`.
    """
    load_suite(path)


def check_suite_kwargs(path: str | Path) -> None:
    """The first of :func:`kwargs_problems`, as a ConfigError."""
    problems = kwargs_problems(path)
    if problems:
        raise _first_of(problems)


def kwargs_problems(path: str | Path) -> list[str]:
    """Every problem of the suite file, one line each in the file's order: those of
    :func:`suite_problems`, and every expectation's kwargs checked with GX's own classes, as
    the run does when it builds the suite (:meth:`collector.settle.gx_runtime.GXRuntime._plan`),
    with its message.

    A missing required kwarg (``expect_column_values_to_not_be_null`` without ``column``) is
    only known to GX's pydantic models, and the run found it after fetching. GX is asked about
    every expectation whose type it knows, even when others in the file are wrong, so a user
    fixing a suite hears about everything at once. Asking imports GX (seconds), so the answer is
    kept per suite content and GX version (:mod:`collector.settle.gx_check_cache`), and this is
    not part of :func:`check_suite_file` (run at every load, in a process that stays free of
    GX): ``collector validate`` calls it when a source has a suite.
    """
    from collector.settle.gx_check_cache import cached_verdict

    path = Path(path)
    problems = _read_suite(path)[1]
    try:
        raw = path.read_bytes()
    except OSError:
        return problems  # _read_suite has said why
    candidates = _gx_candidates(raw)
    if candidates:
        verdict = cached_verdict(raw, lambda: _ask_gx(candidates))
        problems += [f"{path}: {problem}" for _, problem in verdict]
    return sorted(problems, key=_position)


def _gx_candidates(raw: bytes) -> list[Spec]:
    """The expectations GX can be asked about: objects of a type it knows, with object kwargs
    and meta (whatever else is wrong with them is :func:`_read_spec`'s to say)."""
    try:
        data = json.loads(raw)
    except ValueError:
        return []
    expectations = data.get("expectations") if isinstance(data, dict) else None
    if not isinstance(expectations, list):
        return []
    known = _core_expectation_types()
    candidates = []
    for position, item in enumerate(expectations):
        if not isinstance(item, dict):
            continue
        type_ = item.get("type", item.get("expectation_type"))
        kwargs = item.get("kwargs") or {}
        meta = item.get("meta") or {}
        if not isinstance(type_, str) or (known is not None and type_ not in known):
            continue
        if isinstance(kwargs, dict) and isinstance(meta, dict):
            candidates.append(Spec(position, type_, kwargs, meta, None))
    return candidates


def _ask_gx(specs: list[Spec]) -> list[tuple[int, str]]:
    """GX's refusal of each spec it will not build, as ``(position, "where: problem")``."""
    from collector.settle.gx_import import import_gx, refusal

    import_gx()
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    refused = []
    for spec in specs:
        try:
            ExpectationConfiguration(
                type=spec.type, kwargs=dict(spec.kwargs), meta=dict(spec.meta)
            ).to_domain_obj()
        except Exception as exc:
            refused.append((spec.position, f"{spec.where}: {refusal(exc)}"))
    return refused


_POSITION = re.compile(r": expectations\[(\d+)\]")


def _position(problem: str) -> int:
    """Where a problem is in its file: its expectation's index, -1 for the file as a whole."""
    found = _POSITION.search(problem)
    return int(found.group(1)) if found else -1
