"""A batch's part of the account is an Account, and the run's account is the sum of its parts.

- Generated batches of outcomes (stored, answered 304, dead by reason, retried, deferred by an
  open breaker, untried for lack of time; some refused as stale) counted by ``count_acks``
  against a plain count of the same outcomes, and settled into a ledger: every term a settle
  moves is, in the ledger, exactly the sum of the batches' reports.
- A real run on the fault site: the reports the run loop hands its listener add up to the run's
  account, term by term.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import load_source
from collector.demo.site import FaultSite
from collector.frontier import Completed, DeadLettered, Lease, Outcome, RetryLater
from collector.run.account import SETTLE_TERMS, TERMS, Account
from collector.run.collection import Collection
from collector.run.drain import DrainPolicy, drain
from collector.run.ledger import Ledger
from collector.run.summary import BatchReport
from collector.settle.outcomes import count_acks
from tests.helpers import write_source

_KINDS = ("stored", "not_modified", "dead", "retried", "circuit_open", "batch_time")
_items = st.lists(
    st.tuples(st.sampled_from(_KINDS), st.sampled_from(["http_404", "parse_error"]), st.booleans()),
    max_size=30,
)


def _outcome(url: str, kind: str, reason: str) -> Outcome:
    if kind in ("stored", "not_modified"):
        return Completed(url, 10.0, 0.0)
    if kind == "dead":
        return DeadLettered(url, 1, reason)
    error = {"retried": "http_503"}.get(kind, kind)
    return RetryLater(url, 1.0, 0.0, 1, 0.0, error)


def _plain(items: list[tuple[str, str, bool]]) -> tuple[dict[str, int], Counter[str]]:
    """The batch's terms counted the obvious way, one item at a time."""
    counts = dict.fromkeys(
        ("stored", "not_modified", "dead_lettered", "returned", "deferred_by_circuit"), 0
    )
    counts |= {"stale_acks": 0, "retried": 0}
    reasons: Counter[str] = Counter()
    for kind, reason, stale in items:
        if stale:
            counts["stale_acks"] += 1
        elif kind == "dead":
            counts["dead_lettered"] += 1
            reasons[reason] += 1
        elif kind == "circuit_open":
            counts["deferred_by_circuit"] += 1
        elif kind in ("retried", "batch_time"):
            counts["returned"] += 1
            counts["retried"] += kind == "retried"
        else:
            counts[kind] += 1
    return counts, reasons


@settings(max_examples=200, deadline=None)
@given(st.lists(_items, max_size=8))
def test_the_run_s_settle_terms_are_the_sum_of_its_batches(
    batches: list[list[tuple[str, str, bool]]],
) -> None:
    ledger = Ledger()
    reports = []
    for b, items in enumerate(batches):
        outcomes = {f"u{b}-{i}": _outcome(f"u{b}-{i}", k, r) for i, (k, r, _) in enumerate(items)}
        stale = [f"u{b}-{i}" for i, (_, _, s) in enumerate(items) if s]
        not_modified = {f"u{b}-{i}" for i, (k, _, _) in enumerate(items) if k == "not_modified"}
        ended = count_acks(outcomes, stale, not_modified)
        counts, reasons = _plain(items)
        for name, count in counts.items():
            assert getattr(ended.account, name) == count, name
        assert ended.reasons == reasons
        report = BatchReport(
            **{**ended.account.values(), "batches": 1, "records_written": counts["stored"]},
            token=b, items=len(items), skipped=ended.skipped, reasons=ended.reasons,
        )  # fmt: skip
        ledger.took(len(items))
        ledger.settled(len(items), report)
        reports.append(report)
    for t in TERMS:
        in_batches = sum(getattr(report, t.name) for report in reports)
        if t.settle:
            assert getattr(ledger, t.name) == in_batches, t.name
        else:
            assert in_batches == 0, t.name  # a report holds no term a settle does not move


def test_a_part_with_a_term_a_settle_does_not_move_is_refused() -> None:
    import pytest

    from collector.errors import ConservationError

    with pytest.raises(ConservationError, match="terms a settle does not move: discovered"):
        Ledger().settled(1, Account(stored=1, discovered=1))


def test_a_real_run_s_batch_reports_add_up_to_its_account(tmp_path: Path) -> None:
    with FaultSite() as site:
        urls = [site.url(f"/items/{i}.json") for i in range(30)]
        urls += [site.url(f"/missing/{i}") for i in range(4)]  # 404: dead
        urls += [site.url(f"/items/{i}.json?status=503&times=1") for i in range(40, 44)]
        urls += [site.url(f"/items/{i}.json?malformed=1") for i in range(50, 52)]
        path = write_source(tmp_path, name="parts", seeds={"urls": urls})
        reports: list[BatchReport] = []

        def listen(event: str, data: dict[str, Any]) -> None:
            if event == "batch":
                reports.append(data["report"])

        async def go() -> Account:
            with Collection(load_source(path), run_id="parts") as run:
                run.plan()
                async with run.engine() as engine:

                    async def fetch(lease: Lease) -> Any:
                        return await run.fetch(engine, lease)

                    try:
                        await drain(run, fetch, DrainPolicy(batch_size=7), listener=listen)
                    finally:
                        await run.aclose()
                run.finish()
                return run.summary().ledger

        account = asyncio.run(go())
    assert not account.problems, account.problems
    assert len(reports) == account.batches > 1
    assert account.dead_lettered > 0 and account.stored > 0
    for t in SETTLE_TERMS:
        assert getattr(account, t.name) == sum(getattr(r, t.name) for r in reports), t.name
