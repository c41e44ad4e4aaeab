"""Split a batch of JSON-like records into good and bad rows with a Great Expectations suite.

A crawler produces batches of ``dict`` records (missing keys, ``None``, nested dicts and lists
are all normal) and must decide, per record, whether it goes to the sink or to the dead
letters. GX answers that question per *column* over a DataFrame, so this module translates in
both directions: records become an object-dtype DataFrame whose index is the record's position,
and GX's ``unexpected_index_list`` becomes a list of :class:`RowFailure` objects holding the
original record objects.

Choices, and why:

* **GX is imported lazily.** ``import great_expectations`` costs 3-7 s; this module imports in
  milliseconds and :class:`SuiteValidator` / :func:`check_suite_file` parse and check the suite
  JSON without GX, so a broken config fails fast at load time. The ephemeral context, pandas
  data source, dataframe asset and whole-dataframe batch definition are built once per
  validator, on the first :meth:`SuiteValidator.validate`, and reused for every batch.
* **Unknown expectation types are caught at load time without importing GX**: the names are
  read from the installed package's ``great_expectations/expectations/core/__init__.py`` (found
  with ``importlib.util.find_spec``, which does not import the package); that file imports
  exactly the core expectations GX registers. If the file cannot be found or read, the check
  moves to the first ``validate()`` (GX's registry), still as a :class:`ConfigError`. Custom or
  plugin expectations are therefore not supported.
* **What needs GX is checked on the first validate()**: kwargs are checked by building each GX
  expectation (pydantic), and every row-level expectation is run once on an empty frame, which
  surfaces data-independent errors GX only raises at run time (``min_value > max_value``,
  expectations with no pandas implementation such as the LIKE-pattern ones). Both raise a
  one-line :class:`ConfigError` naming the file; regexes and type names are already checked at
  load time.
* **Row-level vs table-level**: column-map, column-pair-map and multicolumn-map expectations
  (GX classes ``ColumnMapExpectation``, ``ColumnPairMapExpectation``,
  ``MulticolumnMapExpectation``) run with ``result_format`` COMPLETE and mark the rows in
  ``unexpected_index_list`` bad. ``mostly`` is deliberately ignored for the split: a row that
  violates a row-level expectation is bad, whatever fraction of the batch passes. Everything
  else (row count, column set, column mean, ...) lands in ``table_failures`` and does not make
  rows bad. As in GX, null values (``None``/NaN, a missing key counts as null) are skipped by
  row-level expectations other than the null checks.
* **A column missing from every record** is not sent to GX (it would raise): each row fails a
  row-level expectation on it with ``column 'price' missing``; a table-level one fails once.
* **Values GX cannot compare** (``"abc"`` against ``min_value: 0``, a list in ``value_set``)
  make GX raise for the whole expectation. The expectation is then re-run on the rows grouped by
  the Python types of the values it reads; rows of a group on which GX still raises fail with
  ``could not be checked`` and GX's reason. Cross-row expectations (unique, increasing) are
  only compared within a group in that fallback.
* **Type expectations are evaluated here, per row, not by GX.**
  ``expect_column_values_to_be_of_type`` / ``_in_type_list`` in GX 1.24 check pandas
  object columns with ``isinstance(value, np.dtype(type_).type or native)``: ``"int64"`` then
  rejects every Python ``int`` (only ``numpy.int64`` matches), ``"float64"`` rejects Python
  floats, and ``"int"`` accepts ``True`` (``bool`` subclasses ``int``). For JSON data that is
  wrong, so those two expectations are checked in this module: Python and numpy names map to
  JSON-ish kinds (``int``/``int64``/``Int64``/``long`` -> integers but not booleans, sized and
  unsigned integers also range-checked; ``float``/``float64``/``double`` -> floats, not ints,
  as in GX; ``str``/``string``; ``bool``/``bool_``; ``list``; ``dict``; ``object`` -> anything);
  other names resolve like GX does (``np.dtype(name).type``, then pandas attributes). Their
  kwargs are still validated by GX, and ``row_condition`` on them is refused.
* **Output**: GX prints nothing to stdout here (checked in the tests); progress bars and
  analytics are disabled in the context config, ``GX_ANALYTICS_ENABLED=false`` is set (if
  unset) before the import, and a ``NullHandler`` on the ``great_expectations`` logger keeps its
  warnings off stderr unless the application configures logging itself.
* GX calls are serialised with one module-wide lock: GX keeps process-wide state (the "current"
  context) and its objects are not documented as thread-safe.

Measured cost (2-core shared VM, load ~2, GX 1.24.1, pandas 3.1.1), 500 records, suite of 4
GX row-level expectations (not-null, between, regex, in-set) + of-type (checked here) + table
row count, after warm-up: median ~40 ms per batch (min 34 ms), i.e. ~12,000 records/s for
validation alone, ~12% of the 333 ms a 500-record batch may take at 1,500 records/s. The cost
is GX's per-call overhead, not data: the same suite on 50 records takes ~33 ms; 1 / 5 / 10 GX
expectations take ~18 / ~35 / ~59 ms (about 5 ms base + 5 ms per expectation). cProfile puts
~85% of it in GX's bookkeeping per call (re-deriving expectation configurations through
pydantic, building MetricConfiguration ids and the metric graph) and ~10% in computing the
metrics on the DataFrame; no public GX API avoids it. A batch with values GX cannot compare
pays ~5 ms more per value type for the fallback described above. The first validate() of a
validator costs the GX import (3-7 s) plus ~0.1 s for the context and the empty-frame check.
An empty batch returns at once without touching GX (so table-level expectations such as a
minimum row count are not evaluated for it).

Because the cost is per call, :meth:`SuiteValidator.validate_many` validates several batches in
one GX call when that is exact (see its docstring): 8 batches of 500 in one call cost about a
sixth of 8 calls (``bench/validation.py``).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import numbers
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector._text import one_line, quoted
from collector.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BatchValidation",
    "FailedExpectation",
    "RowFailure",
    "SuiteValidator",
    "check_suite_file",
]


@dataclass(frozen=True, slots=True)
class FailedExpectation:
    """One expectation that a row (or the whole batch) did not meet.

    ``kwargs`` is the expectation's kwargs as read from the suite file (JSON-safe). The same
    dict is shared by every failure of that expectation, so treat it as read-only.
    """

    expectation: str
    column: str | None
    kwargs: dict[str, Any]
    message: str


@dataclass(frozen=True, slots=True)
class RowFailure:
    """A record that failed at least one row-level expectation, with every one it failed."""

    index: int
    record: dict[str, Any]
    failed: tuple[FailedExpectation, ...]


@dataclass(frozen=True, slots=True)
class BatchValidation:
    """The outcome of validating one batch: rows to keep, rows to reject, batch-level problems."""

    good: list[dict[str, Any]]
    bad: list[RowFailure]
    table_failures: tuple[FailedExpectation, ...]
    seconds: float


# ----------------------------------------------------------------------------------------------
# Loading the suite file (no GX)
# ----------------------------------------------------------------------------------------------

_TYPE_EXPECTATIONS = frozenset(
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
_META_KEY = "_collector_position"


@dataclass(frozen=True, slots=True)
class _TypeRule:
    """How one type name from a suite is checked against one non-null JSON value."""

    name: str
    matches: Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class _Spec:
    """One expectation as read from the file; ``type_rules`` only for the two type checks."""

    position: int
    type: str
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    type_rules: tuple[_TypeRule, ...] | None

    @property
    def where(self) -> str:
        return f"expectations[{self.position}] ({self.type})"


@dataclass(frozen=True, slots=True)
class _Suite:
    path: Path
    name: str
    specs: tuple[_Spec, ...]
    parameters: dict[str, Any]


def _one_line(text: object, limit: int = 300) -> str:
    """A message (often a multi-line GX/pydantic text) on one line; spaces inside a line are
    kept (a value like ``'  tools '`` must show its spaces): :func:`collector._text.one_line`."""
    return one_line(text, limit)


def _show(value: object, limit: int = 60) -> str:
    """A short repr of a record value for messages."""
    try:
        text = quoted(value)  # repr, except that a regex keeps its single backslashes
    except Exception:  # a hostile __repr__ must not break validation
        text = f"<{type(value).__name__}>"
    text = _one_line(text, 1000)
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


def _is_null(value: object) -> bool:
    """What pandas/GX treat as missing in an object column (JSON has only None and NaN)."""
    if value is None:
        return True
    if isinstance(value, float):
        return math.isnan(value)
    return type(value).__name__ in ("NAType", "NaTType")


def _is_numpy(value: object) -> bool:
    return type(value).__module__ == "numpy"


def _integer_rule(name: str, lo: int | None, hi: int | None) -> _TypeRule:
    def matches(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            return False  # JSON true/false is not an integer even though bool subclasses int
        number = int(value)
        return (lo is None or number >= lo) and (hi is None or number <= hi)

    return _TypeRule(name, matches)


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


def _instance_rule(name: str, *types: type) -> _TypeRule:
    return _TypeRule(name, lambda value: isinstance(value, types))


def _static_type_rule(name: str) -> _TypeRule | None:
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
        return _TypeRule(name, _float_matches)
    if key in ("str", "string", "string_types", "unicode", "str_", "unicode_", "u"):
        return _instance_rule(name, str)
    if key in ("bool", "bool_", "boolean"):
        return _TypeRule(name, _bool_matches)
    if key in ("object", "object_", "o"):
        return _TypeRule(name, lambda value: True)
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


def _type_rule(name: str) -> _TypeRule | None:
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
) -> tuple[_TypeRule, ...] | None:
    if kwargs.get("row_condition") is not None:
        raise ConfigError(
            f"{path}: {spec_where}: row_condition is not supported on type expectations"
        )
    if type_ == "expect_column_values_to_be_of_type":
        wanted = kwargs.get("type_")
        if wanted is None:
            return None
        if not isinstance(wanted, str):
            raise ConfigError(f"{path}: {spec_where}: type_ must be a string, got {_show(wanted)}")
        names = [wanted]
    else:
        listed = kwargs.get("type_list")
        if listed is None:
            return None
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            raise ConfigError(
                f"{path}: {spec_where}: type_list must be a list of strings, got {_show(listed)}"
            )
        names = listed
    rules = []
    for name in names:
        rule = _type_rule(name)
        if rule is None:
            raise ConfigError(f"{path}: {spec_where}: unknown type {name!r}")
        rules.append(rule)
    return tuple(rules)


def _check_regexes(path: Path, where: str, kwargs: Mapping[str, Any]) -> None:
    """Compile regexes now: GX would only fail on them while validating data."""
    patterns: list[Any] = []
    if "regex" in kwargs:
        patterns.append(kwargs["regex"])
    if isinstance(kwargs.get("regex_list"), list):
        patterns.extend(kwargs["regex_list"])
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue  # GX's own kwargs check reports the wrong type on first validate()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{path}: {where}: invalid regex {pattern!r}: {exc}") from exc


def _load_suite(suite_path: str | Path) -> _Suite:
    """Read and check a suite file without GX; every problem is a one-line ConfigError."""
    path = Path(suite_path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: suite file not found") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{path}: suite path is a directory, not a JSON file") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: suite file is not UTF-8 text") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read suite file: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: not an expectation suite: top level is a JSON {type(data).__name__}, "
            "expected an object with an 'expectations' list"
        )
    expectations = data.get("expectations")
    if not isinstance(expectations, list):
        what = "no 'expectations' key" if expectations is None else "'expectations' is not a list"
        raise ConfigError(f"{path}: not an expectation suite: {what}")
    name = data.get("name") or data.get("expectation_suite_name") or path.stem
    if not isinstance(name, str):
        raise ConfigError(f"{path}: suite 'name' must be a string, got {_show(name)}")
    parameters = data.get("suite_parameters") or {}
    if not isinstance(parameters, dict):
        raise ConfigError(f"{path}: 'suite_parameters' must be an object")

    known = _core_expectation_types()
    specs = []
    for position, item in enumerate(expectations):
        where = f"expectations[{position}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: {where} is not an object")
        type_ = item.get("type", item.get("expectation_type"))
        if type_ is None:
            raise ConfigError(f"{path}: {where} has no 'type'")
        if not isinstance(type_, str):
            raise ConfigError(f"{path}: {where}: 'type' must be a string, got {_show(type_)}")
        if "type" in item and "expectation_type" in item and item["expectation_type"] != type_:
            raise ConfigError(f"{path}: {where}: 'type' and 'expectation_type' disagree")
        where = f"{where} ({type_})"
        unknown_keys = sorted(set(item) - _EXPECTATION_KEYS)
        if unknown_keys:
            raise ConfigError(f"{path}: {where}: unknown key {unknown_keys[0]!r}")
        if known is not None and type_ not in known:
            close = difflib.get_close_matches(type_, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{path}: {where}: unknown expectation type{hint}")
        kwargs = item.get("kwargs")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise ConfigError(f"{path}: {where}: 'kwargs' must be an object")
        meta = item.get("meta")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise ConfigError(f"{path}: {where}: 'meta' must be an object")
        _check_regexes(path, where, kwargs)
        rules = _type_rules(path, where, kwargs, type_) if type_ in _TYPE_EXPECTATIONS else None
        specs.append(_Spec(position, type_, kwargs, meta, rules))
    return _Suite(path=path, name=name, specs=tuple(specs), parameters=parameters)


def check_suite_file(path: str | Path) -> None:
    """Check a suite file cheaply (no GX import) so a bad config fails when a source loads.

    Raises :class:`ConfigError` with one line naming the file and the problem. Kwargs errors
    that only GX can judge are reported by the first :meth:`SuiteValidator.validate`.
    """
    _load_suite(path)


# ----------------------------------------------------------------------------------------------
# Running GX
# ----------------------------------------------------------------------------------------------

_GX_LOCK = threading.RLock()
_RESULT_FORMAT: dict[str, Any] = {
    "result_format": "COMPLETE",
    "partial_unexpected_count": 0,
    "exclude_unexpected_values": True,
    "include_unexpected_rows": False,
    "return_unexpected_index_query": False,
}
_MAX_FALLBACK_GROUPS = 16
# Row-level expectations whose verdict on a row depends on that row alone (an allow-list, so
# that a new or cross-row one such as unique, increasing, z-scores or outliers is never
# validated across batches by mistake).
_ROW_LOCAL = frozenset(
    {
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_null",
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_not_be_in_set",
        "expect_column_values_to_match_regex",
        "expect_column_values_to_not_match_regex",
        "expect_column_values_to_match_regex_list",
        "expect_column_values_to_not_match_regex_list",
        "expect_column_values_to_match_like_pattern",
        "expect_column_values_to_not_match_like_pattern",
        "expect_column_values_to_match_like_pattern_list",
        "expect_column_values_to_not_match_like_pattern_list",
        "expect_column_values_to_match_strftime_format",
        "expect_column_values_to_be_dateutil_parseable",
        "expect_column_values_to_be_json_parseable",
        "expect_column_values_to_match_json_schema",
        "expect_column_value_lengths_to_be_between",
        "expect_column_value_lengths_to_equal",
        "expect_column_values_to_be_of_type",
        "expect_column_values_to_be_in_type_list",
        "expect_column_pair_values_to_be_equal",
        "expect_column_pair_values_a_to_be_greater_than_b",
        "expect_column_pair_values_to_be_in_set",
        "expect_multicolumn_sum_to_equal",
        "expect_multicolumn_values_to_be_equal",
        "expect_select_column_values_to_be_unique_within_record",
    }
)
_SUITE_CACHE_SIZE = 16


@dataclass(frozen=True, slots=True)
class _Plan:
    """How one expectation is run: by GX (``gx`` set) or by this module (type checks)."""

    spec: _Spec
    row_level: bool
    columns: tuple[str, ...]
    gx: Any

    @property
    def column(self) -> str | None:
        column = self.spec.kwargs.get("column")
        return column if isinstance(column, str) else None


def _import_gx() -> Any:
    """Import GX quietly: no analytics, no progress bars, no log output unless asked for."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    gx_logger = logging.getLogger("great_expectations")
    if not any(isinstance(h, logging.NullHandler) for h in gx_logger.handlers):
        gx_logger.addHandler(logging.NullHandler())
    import great_expectations

    return great_expectations


def _pydantic_message(exc: Exception) -> str:
    """``field: problem; field: problem`` from a pydantic (v1) ValidationError, one per field."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return _one_line(exc)
    seen: dict[str, str] = {}
    try:
        for error in errors():
            loc = ".".join(str(part) for part in error.get("loc", ()) if part != "__root__")
            seen.setdefault(loc, str(error.get("msg", "")))
    except Exception:
        return _one_line(exc)
    return _one_line("; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in seen.items()))


def _exception_of(result: Any) -> str | None:
    """The error message GX caught while evaluating one expectation, or ``None``."""
    info = getattr(result, "exception_info", None) or {}
    if "raised_exception" in info:
        infos: Iterable[Any] = [info]
    else:
        infos = info.values()
    for item in infos:
        if isinstance(item, Mapping) and item.get("raised_exception"):
            return _one_line(item.get("exception_message") or "GX raised an exception")
    return None


class _GXRuntime:
    """The GX objects for one suite, built once and reused for every batch."""

    def __init__(self, suite: _Suite) -> None:
        gx = _import_gx()
        from great_expectations.core.expectation_suite import ExpectationSuite
        from great_expectations.data_context.types.base import (
            DataContextConfig,
            InMemoryStoreBackendDefaults,
            ProgressBarsConfig,
        )
        from great_expectations.expectations.expectation import (
            ColumnMapExpectation,
            ColumnPairMapExpectation,
            MulticolumnMapExpectation,
        )

        self._suite = suite
        self._suite_cls = ExpectationSuite
        self._suites: dict[tuple[int, ...], Any] = {}
        self.calls = 0  # GX validations run (benchmarks and tests count them)
        self.plans = tuple(
            self._plan(
                spec, (ColumnMapExpectation, ColumnPairMapExpectation, MulticolumnMapExpectation)
            )
            for spec in suite.specs
        )
        config = DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
            analytics_enabled=False,
        )
        context = gx.get_context(mode="ephemeral", project_config=config)
        asset = context.data_sources.add_pandas(name="collector").add_dataframe_asset(
            name="records"
        )
        self._context = context
        self._batch_definition = asset.add_batch_definition_whole_dataframe(name="batch")
        self._smoke_test()
        self.columns = frozenset(c for plan in self.plans for c in plan.columns)
        self.row_wise = all(plan.row_level and plan.spec.type in _ROW_LOCAL for plan in self.plans)
        """Every expectation judges each row on that row alone: batches may be validated
        together (``validate_many``)."""

    def _plan(self, spec: _Spec, row_level_classes: tuple[type, ...]) -> _Plan:
        from great_expectations.expectations.expectation_configuration import (
            ExpectationConfiguration,
        )

        path = self._suite.path
        try:
            configuration = ExpectationConfiguration(
                type=spec.type,
                kwargs=dict(spec.kwargs),
                meta={**spec.meta, _META_KEY: spec.position},
            )
            expectation = configuration.to_domain_obj()
        except Exception as exc:
            if type(exc).__name__ == "ExpectationNotFoundError":
                raise ConfigError(f"{path}: {spec.where}: unknown expectation type") from exc
            if type(exc).__name__ == "ValidationError":
                problem = _pydantic_message(exc)
            else:
                problem = _one_line(getattr(exc, "message", None) or exc)
            raise ConfigError(f"{path}: {spec.where}: invalid kwargs: {problem}") from exc
        kwargs = spec.kwargs
        columns = [kwargs[key] for key in ("column", "column_A", "column_B") if key in kwargs]
        if "column_list" in getattr(type(expectation), "domain_keys", ()):
            columns.extend(kwargs.get("column_list") or [])
        return _Plan(
            spec=spec,
            row_level=isinstance(expectation, row_level_classes),
            columns=tuple(str(c) for c in columns),
            gx=None if spec.type in _TYPE_EXPECTATIONS else expectation,
        )

    def _smoke_test(self) -> None:
        """Run the row-level expectations once on an empty frame to catch run-time-only errors.

        With no rows, nothing can fail because of data, so any exception is the suite's fault
        (``min_value`` above ``max_value``, an expectation with no pandas implementation...).
        """
        import pandas as pd

        plans = [plan for plan in self.plans if plan.row_level and plan.gx is not None]
        if not plans:
            return
        columns = dict.fromkeys(c for plan in plans for c in plan.columns)
        frame = pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})
        results = self.run(frame, plans)
        for plan in plans:
            error = _exception_of(results.get(plan.spec.position))
            if error is not None:
                raise ConfigError(
                    f"{self._suite.path}: {plan.spec.where}: cannot be evaluated on records: "
                    f"{error}"
                )

    def run(self, frame: pd.DataFrame, plans: Sequence[_Plan]) -> dict[int, Any]:
        """Validate ``frame`` with the GX expectations of ``plans``; results by position."""
        key = tuple(plan.spec.position for plan in plans)
        suite = self._suites.get(key)
        if suite is None:
            if len(self._suites) >= _SUITE_CACHE_SIZE:
                self._suites.clear()
            suite = self._suite_cls(name=self._suite.name, expectations=[plan.gx for plan in plans])
            self._suites[key] = suite
        self.calls += 1
        batch = self._batch_definition.get_batch(batch_parameters={"dataframe": frame})
        outcome = batch.validate(
            suite,
            result_format=dict(_RESULT_FORMAT),
            expectation_parameters=self._suite.parameters or None,
        )
        results: dict[int, Any] = {}
        for result in outcome.results:
            meta = getattr(result.expectation_config, "meta", None) or {}
            position = meta.get(_META_KEY)
            if isinstance(position, int):
                results[position] = result
        return results


# ----------------------------------------------------------------------------------------------
# Messages
# ----------------------------------------------------------------------------------------------


def _kwargs_text(kwargs: Mapping[str, Any]) -> str:
    skip = {"column", "column_A", "column_B", "result_format", "catch_exceptions", "meta"}
    parts = [f"{k}={_show(v, 40)}" for k, v in kwargs.items() if k not in skip]
    return ", ".join(parts) if parts else "no kwargs"


def _value_text(record: Mapping[str, Any], column: str) -> str:
    return f"value {_show(record[column])}" if column in record else "key missing"


def _row_message(plan: _Plan, record: Mapping[str, Any]) -> str:
    """Short human text for one row failing one row-level expectation."""
    kind, kw = plan.spec.type, plan.spec.kwargs
    column = plan.column
    if column is None:
        shown = ", ".join(f"{c}={_show(record.get(c), 30)}" for c in plan.columns)
        return f"{shown} failed {kind}"
    value = record.get(column)
    text = _value_text(record, column)
    if kind == "expect_column_values_to_not_be_null":
        return f"{column}: {'value is null' if column in record else 'key missing'}"
    if kind == "expect_column_values_to_be_between":
        return f"{column}: {text} not between {kw.get('min_value')} and {kw.get('max_value')}"
    if kind == "expect_column_values_to_be_in_set":
        return f"{column}: {text} not in set {_show(kw.get('value_set'))}"
    if kind == "expect_column_values_to_not_be_in_set":
        return f"{column}: {text} is in forbidden set {_show(kw.get('value_set'))}"
    if kind == "expect_column_values_to_match_regex":
        return f"{column}: {text} does not match regex {_show(kw.get('regex'))}"
    if kind == "expect_column_values_to_not_match_regex":
        return f"{column}: {text} matches forbidden regex {_show(kw.get('regex'))}"
    if kind == "expect_column_values_to_be_of_type":
        return f"{column}: {text} ({type(value).__name__}) is not of type {kw.get('type_')}"
    if kind == "expect_column_values_to_be_in_type_list":
        return (
            f"{column}: {text} ({type(value).__name__}) is not one of types "
            f"{_show(kw.get('type_list'))}"
        )
    if kind == "expect_column_value_lengths_to_be_between":
        return (
            f"{column}: length of {text} not between {kw.get('min_value')} and "
            f"{kw.get('max_value')}"
        )
    if kind == "expect_column_value_lengths_to_equal":
        return f"{column}: length of {text} is not {kw.get('value')}"
    if kind == "expect_column_values_to_be_unique":
        return f"{column}: {text} is not unique in the batch"
    if kind == "expect_column_values_to_be_null":
        return f"{column}: {text} is not null"
    return f"{column}: {text} failed {kind}"


def _table_message(plan: _Plan, result: Any) -> str:
    """Short human text for a failed table-level expectation."""
    prefix = f"{plan.column}: " if plan.column else ""
    observed = (getattr(result, "result", None) or {}).get("observed_value")
    return (
        f"{prefix}{plan.spec.type} failed: observed {_show(observed)}, "
        f"expected {_kwargs_text(plan.spec.kwargs)}"
    )


def _missing_text(missing: Sequence[str]) -> str:
    if len(missing) == 1:
        return f"column {missing[0]!r} missing"
    return "columns " + ", ".join(repr(c) for c in missing) + " missing"


# ----------------------------------------------------------------------------------------------
# The validator
# ----------------------------------------------------------------------------------------------


def _frame(records: Sequence[Mapping[str, Any]], columns: Iterable[str]) -> pd.DataFrame:
    """Object-dtype DataFrame, index = position; nested values stay whole Python objects."""
    import pandas as pd

    index = pd.RangeIndex(len(records))
    data = {
        column: pd.Series([record.get(column) for record in records], dtype=object, index=index)
        for column in columns
    }
    return pd.DataFrame(data, index=index)


def _check_records(records: Sequence[object]) -> None:
    for position, record in enumerate(records):
        if not isinstance(record, dict):
            raise TypeError(f"record {position} is a {type(record).__name__}, expected a dict")


def _split(
    outcome: BatchValidation, batches: Sequence[list[dict[str, Any]]]
) -> list[BatchValidation]:
    """Cut the answer for concatenated ``batches`` into one answer per batch (local indexes)."""
    total = sum(len(records) for records in batches) or 1
    bad = iter(outcome.bad)
    row = next(bad, None)
    answers = []
    offset = 0
    for records in batches:
        end = offset + len(records)
        failures: list[RowFailure] = []
        while row is not None and row.index < end:
            failures.append(RowFailure(row.index - offset, row.record, row.failed))
            row = next(bad, None)
        failing = {failure.index for failure in failures}
        answers.append(
            BatchValidation(
                good=[record for i, record in enumerate(records) if i not in failing],
                bad=failures,
                table_failures=(),
                seconds=outcome.seconds * len(records) / total,
            )
        )
        offset = end
    return answers


class SuiteValidator:
    """Validate record batches against one suite file; reuse one instance for many batches.

    The file is read and checked in the constructor without importing GX (``ConfigError`` for a
    bad file). GX itself is imported and set up on the first :meth:`validate`, which may also
    raise ``ConfigError`` for kwargs only GX can judge.
    """

    __slots__ = ("_error", "_lock", "_runtime", "_suite")

    def __init__(self, suite_path: str | Path) -> None:
        self._suite = _load_suite(suite_path)
        self._runtime: _GXRuntime | None = None
        self._error: ConfigError | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SuiteValidator({str(self._suite.path)!r}, {len(self._suite.specs)} expectations)"

    @property
    def gx_calls(self) -> int:
        """GX validations run so far by this validator (including its set-up check)."""
        return 0 if self._runtime is None else self._runtime.calls

    @property
    def expectation_types(self) -> tuple[str, ...]:
        """The expectation types of the suite, in file order (one entry per expectation)."""
        return tuple(spec.type for spec in self._suite.specs)

    def _ensure_runtime(self) -> _GXRuntime:
        """Build the GX objects once; a suite GX rejects keeps failing fast, without rebuilding."""
        with self._lock:
            if self._error is not None:
                raise ConfigError(str(self._error)) from self._error.__cause__
            if self._runtime is None:
                try:
                    self._runtime = _GXRuntime(self._suite)
                except ConfigError as exc:
                    self._error = exc
                    raise
            return self._runtime

    def validate(self, records: list[dict[str, Any]]) -> BatchValidation:
        """Split ``records`` into good records and :class:`RowFailure` objects.

        Records keep their identity: ``good`` and ``RowFailure.record`` are the input objects.
        """
        started = time.perf_counter()
        if not records:
            return BatchValidation([], [], (), time.perf_counter() - started)
        _check_records(records)
        outcome, _ = self._validate(records, started)
        return outcome

    def validate_many(self, batches: Sequence[list[dict[str, Any]]]) -> list[BatchValidation]:
        """Validate several batches, with one GX call for all of them when that is exact.

        GX's cost is per call (see the module docstring), so batches waiting to be settled are
        validated together when the answer cannot differ from one call per batch: every GX
        expectation of the suite is row-level and reads one row only (not ``unique`` or
        ``increasing``...), the batch has every column the suite reads (a column missing from
        a whole batch fails differently), and the combined call is *clean*: no table failure
        and no expectation on which GX raised (the type-group fallback). Anything else is
        validated batch by batch, as :meth:`validate` would. ``seconds`` of a combined call is
        shared between its batches in proportion to their records.
        """
        for records in batches:
            if records:
                _check_records(records)
        nonempty = [i for i, records in enumerate(batches) if records]
        answers: dict[int, BatchValidation] = {}
        if len(nonempty) > 1 and self._ensure_runtime().row_wise:
            needed = self._ensure_runtime().columns
            together = [
                i for i in nonempty if needed <= {key for record in batches[i] for key in record}
            ]
            if len(together) > 1:
                combined = [record for i in together for record in batches[i]]
                outcome, clean = self._validate(combined, time.perf_counter())
                if clean:
                    parts = _split(outcome, [batches[i] for i in together])
                    answers.update(zip(together, parts, strict=True))
        return [answers.get(i) or self.validate(records) for i, records in enumerate(batches)]

    def _validate(
        self, records: list[dict[str, Any]], started: float
    ) -> tuple[BatchValidation, bool]:
        """Validate non-empty, checked records; also says whether the answer is clean.

        Clean: no table-level failure and no expectation GX could not evaluate on the whole
        frame, i.e. the answer of every row depends on that row alone (see validate_many).
        """
        clean = True
        columns = dict.fromkeys(key for record in records for key in record)
        with _GX_LOCK:
            runtime = self._ensure_runtime()
            rows: dict[int, list[tuple[int, FailedExpectation]]] = {}
            table: list[tuple[int, FailedExpectation]] = []
            frame = _frame(records, columns)
            to_gx: list[_Plan] = []
            for plan in runtime.plans:
                missing = [c for c in plan.columns if c not in columns]
                if missing:
                    failure = self._failure(plan, _missing_text(missing))
                    if plan.row_level:
                        for index in range(len(records)):
                            rows.setdefault(index, []).append((plan.spec.position, failure))
                    else:
                        table.append((plan.spec.position, failure))
                elif plan.gx is None:
                    self._check_types(plan, records, rows)
                else:
                    to_gx.append(plan)
            results = runtime.run(frame, to_gx) if to_gx else {}
            for plan in to_gx:
                result = results.get(plan.spec.position)
                if result is None or _exception_of(result) is not None:
                    clean = False
                self._collect(
                    runtime, plan, results.get(plan.spec.position), frame, records, rows, table
                )
        bad = [
            RowFailure(
                index=index,
                record=records[index],
                failed=tuple(f for _, f in sorted(rows[index], key=lambda item: item[0])),
            )
            for index in sorted(rows)
        ]
        good = [record for index, record in enumerate(records) if index not in rows]
        table.sort(key=lambda item: item[0])
        outcome = BatchValidation(
            good=good,
            bad=bad,
            table_failures=tuple(f for _, f in table),
            seconds=time.perf_counter() - started,
        )
        return outcome, clean and not table

    @staticmethod
    def _failure(plan: _Plan, message: str) -> FailedExpectation:
        return FailedExpectation(
            expectation=plan.spec.type,
            column=plan.column,
            kwargs=plan.spec.kwargs,
            message=message,
        )

    def _check_types(
        self,
        plan: _Plan,
        records: Sequence[Mapping[str, Any]],
        rows: dict[int, list[tuple[int, FailedExpectation]]],
    ) -> None:
        """Row-level type check for JSON values (see the module docstring for why not GX)."""
        rules = plan.spec.type_rules
        column = plan.column
        if not rules or column is None:
            return
        for index, record in enumerate(records):
            value = record.get(column)
            if _is_null(value) or any(rule.matches(value) for rule in rules):
                continue
            failure = self._failure(plan, _row_message(plan, record))
            rows.setdefault(index, []).append((plan.spec.position, failure))

    def _collect(
        self,
        runtime: _GXRuntime,
        plan: _Plan,
        result: Any,
        frame: pd.DataFrame,
        records: Sequence[Mapping[str, Any]],
        rows: dict[int, list[tuple[int, FailedExpectation]]],
        table: list[tuple[int, FailedExpectation]],
    ) -> None:
        """Turn one GX result into row failures or a table failure."""
        position = plan.spec.position
        if result is None:
            table.append(
                (position, self._failure(plan, f"{plan.spec.type}: GX returned no result"))
            )
            return
        error = _exception_of(result)
        if not plan.row_level:
            if error is not None:
                prefix = f"{plan.column}: " if plan.column else ""
                message = f"{prefix}{plan.spec.type} could not be evaluated: {error}"
                table.append((position, self._failure(plan, message)))
            elif not result.success:
                table.append((position, self._failure(plan, _table_message(plan, result))))
            return
        if error is not None:
            failing = self._fallback(runtime, plan, frame, records, error)
        else:
            unexpected = (result.result or {}).get("unexpected_index_list") or []
            failing = {int(index): None for index in unexpected}
            if not failing and not result.success:
                table.append((position, self._failure(plan, _table_message(plan, result))))
        for index, reason in failing.items():
            record = records[index]
            if reason is None:
                message = _row_message(plan, record)
            else:
                shown = (
                    _value_text(record, plan.column)
                    if plan.column
                    else ", ".join(f"{c}={_show(record.get(c), 30)}" for c in plan.columns)
                )
                prefix = f"{plan.column}: " if plan.column else ""
                message = f"{prefix}{shown} could not be checked by {plan.spec.type}: {reason}"
            rows.setdefault(index, []).append((position, self._failure(plan, message)))

    @staticmethod
    def _fallback(
        runtime: _GXRuntime,
        plan: _Plan,
        frame: pd.DataFrame,
        records: Sequence[Mapping[str, Any]],
        error: str,
    ) -> dict[int, str | None]:
        """GX raised on the whole column: retry per group of value types to find the culprits.

        Returns failing row index -> reason (``None`` = an ordinary failure reported by GX).
        """
        groups: dict[tuple[type, ...], list[int]] = {}
        for index, record in enumerate(records):
            key = tuple(type(record.get(column)) for column in plan.columns)
            groups.setdefault(key, []).append(index)
        if len(groups) == 1 or len(groups) > _MAX_FALLBACK_GROUPS:
            return dict.fromkeys(range(len(records)), error)
        failing: dict[int, str | None] = {}
        for indexes in groups.values():
            result = runtime.run(frame.iloc[indexes], [plan]).get(plan.spec.position)
            group_error = error if result is None else _exception_of(result)
            if result is None or group_error is not None:
                failing.update(dict.fromkeys(indexes, group_error or error))
                continue
            for index in (result.result or {}).get("unexpected_index_list") or []:
                failing[int(index)] = None
        return dict(sorted(failing.items()))
