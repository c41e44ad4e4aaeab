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
* **Each expectation reads its own column, exactly.** GX looks a column name up the way a
  database would: case-insensitively and through quotes and backticks
  (``get_dbms_compatible_column_names``), taking the *first* frame column that matches, so a
  record key ``Price`` earlier in the frame stood in for ``price``. For records they
  are different keys: :meth:`GXRuntime.run` hides from each expectation the frame columns that
  only look like the ones it reads (:func:`look_alikes`), running expectations that need
  different hidings in separate GX calls (none in the common case: no look-alike keys). An
  expectation reading two look-alikes of each other (``Price`` and ``price``) cannot be judged
  exactly by GX and is refused when the suite is built.
* GX calls are serialised with one module-wide lock (:data:`GX_LOCK`): GX keeps process-wide
  state (the "current" context) and its objects are not documented as thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError
from collector.settle.gx_import import build_expectation, import_gx
from collector.settle.suite import TYPE_EXPECTATIONS, Spec, Suite, one_line

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["GX_LOCK", "GXRuntime", "Plan", "exception_of", "look_alikes"]

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
_QUOTES = '"[]`'


def _folded(name: str) -> str:
    """A column name as GX might compare it: case folded, quotes, brackets and backticks off.

    A superset of GX's own matching rules (case-insensitive, a backticked name for its bare
    name, a quoted or bracketed name for its bare name): two names GX could confuse always
    fold alike.
    """
    return name.casefold().strip(_QUOTES)


def look_alikes(names: Iterable[str], columns: Iterable[str]) -> frozenset[str]:
    """The ``columns`` GX might take for one of ``names`` although they are other keys."""
    wanted = set(names)
    folded = {_folded(name) for name in wanted}
    return frozenset(c for c in columns if c not in wanted and _folded(c) in folded)


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
        gx = import_gx()
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
        names = tuple(str(c) for c in columns)
        for index, name in enumerate(names):
            twin = next(
                (c for c in names[:index] if c != name and _folded(c) == _folded(name)), None
            )
            if twin is not None:
                raise ConfigError(
                    f"{self._suite.path}: {spec.where}: reads columns {twin!r} and {name!r}, "
                    "which Great Expectations cannot tell apart (it matches column names "
                    "case-insensitively)"
                )
        return Plan(
            spec=spec,
            row_level=isinstance(expectation, row_level_classes),
            columns=names,
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
        """Validate ``frame`` with the GX expectations of ``plans``; results by position.

        Each expectation sees the frame without the look-alikes of the columns it reads (see
        the module docstring): one GX call per distinct set of hidden columns, one in all when
        the frame has no look-alike keys.
        """
        columns = [str(c) for c in frame.columns]
        hidings: dict[frozenset[str], list[Plan]] = {}
        for plan in plans:
            hidings.setdefault(look_alikes(plan.columns, columns), []).append(plan)
        results: dict[int, Any] = {}
        for hidden, group in hidings.items():
            seen = frame.drop(columns=sorted(hidden)) if hidden else frame
            results.update(self._run(seen, group))
        return results

    def _run(self, frame: pd.DataFrame, plans: Sequence[Plan]) -> dict[int, Any]:
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
