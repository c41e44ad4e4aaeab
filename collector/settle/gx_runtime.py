"""The Great Expectations objects for one suite, built once and reused for every batch.

* **GX is imported lazily**, on the first validation: the ephemeral context, pandas data
  source, dataframe asset and whole-dataframe batch definition are built once per
  :class:`GXRuntime` and reused for every batch.
* **What needs GX is checked when the runtime is built**: kwargs are checked by building each GX
  expectation (pydantic), and every row-level expectation is run once on an empty frame, which
  surfaces data-independent errors GX only raises at run time (``min_value > max_value``,
  expectations with no pandas implementation such as the LIKE-pattern ones). Both raise a
  one-line :class:`~collector.errors.ConfigError` naming the file.
* **Row-level or table-level** is GX's own class: column-map, column-pair-map and
  multicolumn-map expectations (``ColumnMapExpectation``, ``ColumnPairMapExpectation``,
  ``MulticolumnMapExpectation``) run with ``result_format`` COMPLETE so that
  ``unexpected_index_list`` names the failing rows; the type expectations are planned but run
  by :mod:`collector.settle.validation` (see :mod:`collector.settle.suite` for why).
* **Output**: GX prints nothing to stdout here (checked in the tests); progress bars and
  analytics are disabled in the context config, ``GX_ANALYTICS_ENABLED=false`` is set (if
  unset) before the import, and a ``NullHandler`` on the ``great_expectations`` logger keeps its
  warnings off stderr unless the application configures logging itself.
* GX calls are serialised with one module-wide lock (:data:`GX_LOCK`): GX keeps process-wide
  state (the "current" context) and its objects are not documented as thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError
from collector.settle.suite import TYPE_EXPECTATIONS, Spec, Suite, one_line

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GX_LOCK", "GXRuntime", "Plan", "exception_of"]

_META_KEY = "_collector_position"
GX_LOCK = threading.RLock()
_RESULT_FORMAT: dict[str, Any] = {
    "result_format": "COMPLETE",
    "partial_unexpected_count": 0,
    "exclude_unexpected_values": True,
    "include_unexpected_rows": False,
    "return_unexpected_index_query": False,
}
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
class Plan:
    """How one expectation is run: by GX (``gx`` set) or by this module (type checks)."""

    spec: Spec
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


def build_expectation(configuration: Any, spec: Spec, path: object) -> Any:
    """GX's expectation object for ``spec``, or one ConfigError naming the suite file and the
    expectation: an unknown type, or kwargs GX's own models refuse (a missing ``column``).

    The run builds its suite with it, and ``collector validate`` checks a suite with it
    (collector.settle.suite.check_suite_kwargs), so both say the same thing.
    """
    try:
        return configuration.to_domain_obj()
    except Exception as exc:
        if type(exc).__name__ == "ExpectationNotFoundError":
            raise ConfigError(f"{path}: {spec.where}: unknown expectation type") from exc
        if type(exc).__name__ == "ValidationError":
            problem = _pydantic_message(exc)
        else:
            problem = one_line(getattr(exc, "message", None) or exc)
        raise ConfigError(f"{path}: {spec.where}: invalid kwargs: {problem}") from exc


def _pydantic_message(exc: Exception) -> str:
    """``field: problem; field: problem`` from a pydantic (v1) ValidationError, one per field."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return one_line(exc)
    seen: dict[str, str] = {}
    try:
        for error in errors():
            loc = ".".join(str(part) for part in error.get("loc", ()) if part != "__root__")
            seen.setdefault(loc, str(error.get("msg", "")))
    except Exception:
        return one_line(exc)
    return one_line("; ".join(f"{loc}: {msg}" if loc else msg for loc, msg in seen.items()))


def exception_of(result: Any) -> str | None:
    """The error message GX caught while evaluating one expectation, or ``None``."""
    info = getattr(result, "exception_info", None) or {}
    if "raised_exception" in info:
        infos: Iterable[Any] = [info]
    else:
        infos = info.values()
    for item in infos:
        if isinstance(item, Mapping) and item.get("raised_exception"):
            return one_line(item.get("exception_message") or "GX raised an exception")
    return None


class GXRuntime:
    """The GX objects for one suite, built once and reused for every batch."""

    def __init__(self, suite: Suite) -> None:
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

    def _plan(self, spec: Spec, row_level_classes: tuple[type, ...]) -> Plan:
        from great_expectations.expectations.expectation_configuration import (
            ExpectationConfiguration,
        )

        configuration = ExpectationConfiguration(
            type=spec.type,
            kwargs=dict(spec.kwargs),
            meta={**spec.meta, _META_KEY: spec.position},
        )
        expectation = build_expectation(configuration, spec, self._suite.path)
        kwargs = spec.kwargs
        columns = [kwargs[key] for key in ("column", "column_A", "column_B") if key in kwargs]
        if "column_list" in getattr(type(expectation), "domain_keys", ()):
            columns.extend(kwargs.get("column_list") or [])
        return Plan(
            spec=spec,
            row_level=isinstance(expectation, row_level_classes),
            columns=tuple(str(c) for c in columns),
            gx=None if spec.type in TYPE_EXPECTATIONS else expectation,
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
            error = exception_of(results.get(plan.spec.position))
            if error is not None:
                raise ConfigError(
                    f"{self._suite.path}: {plan.spec.where}: cannot be evaluated on records: "
                    f"{error}"
                )

    def run(self, frame: pd.DataFrame, plans: Sequence[Plan]) -> dict[int, Any]:
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
