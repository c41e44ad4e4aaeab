"""Split a batch of JSON-like records into good and bad rows with a Great Expectations suite.

A crawler produces batches of ``dict`` records (missing keys, ``None``, nested dicts and lists
are all normal) and must decide, per record, whether it goes to the sink or to the dead
letters. GX answers that question per *column* over a DataFrame; :class:`SuiteValidator`
translates in both directions. The pieces live beside it:

* :mod:`collector.settle.suite` reads and checks the suite file without GX (load time);
* :mod:`collector.settle.gx_runtime` builds the GX objects once, on the first validation;
* :mod:`collector.settle.rowsplit` holds the result types, records -> DataFrame and back;
* :mod:`collector.settle.messages` words each failure in one line.

How a batch is split, and why:

* **Row-level vs table-level**: rows in a row-level expectation's ``unexpected_index_list`` are
  bad. ``mostly`` is deliberately ignored for the split: a row that violates a row-level
  expectation is bad, whatever fraction of the batch passes. Everything else (row count,
  column set, column mean, ...) lands in ``table_failures`` and does not make rows bad. As in
  GX, null values (``None``/NaN, a missing key counts as null) are skipped by row-level
  expectations other than the null checks.
* **A column missing from every record** is not sent to GX (it would raise): each row fails a
  row-level expectation on it with ``column 'price' missing``; a table-level one fails once.
* **Values GX cannot compare** (``"abc"`` against ``min_value: 0``, a list in ``value_set``)
  make GX raise for the whole expectation. The expectation is then re-run on the rows grouped by
  the Python types of the values it reads; rows of a group on which GX still raises fail with
  ``could not be checked`` and GX's reason. Cross-row expectations (unique, increasing) are
  only compared within a group in that fallback.
* **Type expectations** are checked here, per row (see :mod:`collector.settle.suite`).

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
sixth of 8 calls (``bench/validation.py``; figures in docs/performance.md), so the grouped
path stays, checked against the plain one by ``tests/test_validation_oracle.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError
from collector.settle.gx_runtime import GX_LOCK, GXRuntime, Plan, exception_of
from collector.settle.messages import missing_text, row_message, table_message, value_text
from collector.settle.rowsplit import (
    BatchValidation,
    FailedExpectation,
    RowFailure,
    check_records,
    split_answer,
    to_frame,
)
from collector.settle.suite import check_suite_file, is_null, load_suite, show

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BatchValidation",
    "FailedExpectation",
    "RowFailure",
    "SuiteValidator",
    "check_suite_file",
]

_MAX_FALLBACK_GROUPS = 16


class SuiteValidator:
    """Validate record batches against one suite file; reuse one instance for many batches.

    The file is read and checked in the constructor without importing GX (``ConfigError`` for a
    bad file). GX itself is imported and set up on the first :meth:`validate`, which may also
    raise ``ConfigError`` for kwargs only GX can judge.
    """

    __slots__ = ("_error", "_lock", "_runtime", "_suite")

    def __init__(self, suite_path: str | Path) -> None:
        self._suite = load_suite(suite_path)
        self._runtime: GXRuntime | None = None
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

    def _ensure_runtime(self) -> GXRuntime:
        """Build the GX objects once; a suite GX rejects keeps failing fast, without rebuilding."""
        with self._lock:
            if self._error is not None:
                raise ConfigError(str(self._error)) from self._error.__cause__
            if self._runtime is None:
                try:
                    self._runtime = GXRuntime(self._suite)
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
        check_records(records)
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

        Why a row's verdict cannot depend on the other batches: the frame is object-dtype (no
        type inferred from other rows), the expectations are row-local, and each one reads its
        own column only (``GXRuntime.run`` hides look-alike keys such as ``Price`` from an
        expectation on ``price``, which GX would otherwise match case-insensitively).
        """
        for records in batches:
            if records:
                check_records(records)
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
                    parts = split_answer(outcome, [batches[i] for i in together])
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
        with GX_LOCK:
            runtime = self._ensure_runtime()
            rows: dict[int, list[tuple[int, FailedExpectation]]] = {}
            table: list[tuple[int, FailedExpectation]] = []
            frame = to_frame(records, columns)
            to_gx: list[Plan] = []
            for plan in runtime.plans:
                missing = [c for c in plan.columns if c not in columns]
                if missing:
                    failure = self._failure(plan, missing_text(missing))
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
                if result is None or exception_of(result) is not None:
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
    def _failure(plan: Plan, message: str) -> FailedExpectation:
        return FailedExpectation(
            expectation=plan.spec.type,
            column=plan.column,
            kwargs=plan.spec.kwargs,
            message=message,
        )

    def _check_types(
        self,
        plan: Plan,
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
            if is_null(value) or any(rule.matches(value) for rule in rules):
                continue
            failure = self._failure(plan, row_message(plan, record))
            rows.setdefault(index, []).append((plan.spec.position, failure))

    def _collect(
        self,
        runtime: GXRuntime,
        plan: Plan,
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
        error = exception_of(result)
        if not plan.row_level:
            if error is not None:
                prefix = f"{plan.column}: " if plan.column else ""
                message = f"{prefix}{plan.spec.type} could not be evaluated: {error}"
                table.append((position, self._failure(plan, message)))
            elif not result.success:
                table.append((position, self._failure(plan, table_message(plan, result))))
            return
        if error is not None:
            failing = self._fallback(runtime, plan, frame, records, error)
        else:
            unexpected = (result.result or {}).get("unexpected_index_list") or []
            failing = {int(index): None for index in unexpected}
            if not failing and not result.success:
                table.append((position, self._failure(plan, table_message(plan, result))))
        for index, reason in failing.items():
            record = records[index]
            if reason is None:
                message = row_message(plan, record)
            else:
                shown = (
                    value_text(record, plan.column)
                    if plan.column
                    else ", ".join(f"{c}={show(record.get(c), 30)}" for c in plan.columns)
                )
                prefix = f"{plan.column}: " if plan.column else ""
                message = f"{prefix}{shown} could not be checked by {plan.spec.type}: {reason}"
            rows.setdefault(index, []).append((position, self._failure(plan, message)))

    @staticmethod
    def _fallback(
        runtime: GXRuntime,
        plan: Plan,
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
            group_error = error if result is None else exception_of(result)
            if result is None or group_error is not None:
                failing.update(dict.fromkeys(indexes, group_error or error))
                continue
            for index in (result.result or {}).get("unexpected_index_list") or []:
                failing[int(index)] = None
        return dict(sorted(failing.items()))
