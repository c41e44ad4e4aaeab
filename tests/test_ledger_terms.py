"""The run's account: its terms defined once (collector.run.account) and every view made from
them, and the ledger's steps keeping the balance.

- Random sequences of ledger steps (a plan, claims, settled batches, failed batches given back,
  expiries, helpers' work, the end) against a small model of the frontier's view of the run's
  items: the ledger's two checks (balance and claims, and the frontier counts) always hold.
- Every view (the summary, ``--json``, the flow's artifact table, the CLI's ledger table) shows
  every term exactly as its definition says.
- A step given an impossible count raises at once (an internal error, not a silent miscount).
"""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.errors import ConservationError
from collector.frontier.base import StateCounts
from collector.run.account import (
    CLAIM_TERMS,
    END_TERMS,
    INTAKE_TERMS,
    REPORTED_TERMS,
    TERMS,
    Account,
)
from collector.run.ledger import Ledger
from collector.run.summary import RunSummary
from flows.cli.running import _json_line, ledger_rows
from flows.collect import ledger_artifact_rows


class _Model:
    """The frontier's counts of one run's items, moved by the same steps as the ledger."""

    def __init__(self) -> None:
        self.counts = {"queued": 0, "leased": 0, "done": 0, "dead": 0, "expired": 0, "retired": 0}
        self.mine: list[int] = []  # sizes of the run's claims not settled yet

    def move(self, what: str, to: str, n: int) -> int:
        n = min(n, self.counts[what])
        self.counts[what] -= n
        self.counts[to] += n
        return n

    def final(self) -> StateCounts:
        return StateCounts(**self.counts)


_plans = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["full", "incremental", "difference"]),
        "new": st.integers(0, 40),  # offered seeds that were queued
        "duplicates": st.integers(0, 5),
        "fresh": st.integers(0, 10),
        "already_dead": st.integers(0, 5),
        "refused": st.integers(0, 5),
        "adopted": st.integers(0, 10),
        "carried": st.integers(0, 5),
        "retired": st.integers(0, 5),
    }
)
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(1, 12)),
        st.tuples(st.just("settle"), st.lists(st.integers(0, 5), min_size=5, max_size=5)),
        st.tuples(st.just("fail"), st.just(0)),
        st.tuples(st.just("expire"), st.integers(1, 4)),
        st.tuples(st.just("helper"), st.integers(1, 4)),
        st.tuples(st.just("helper_holds"), st.integers(1, 4)),
        st.tuples(st.just("reclaim"), st.integers(0, 3)),
    ),
    max_size=30,
)


def _plan(ledger: Ledger, model: _Model, p: dict[str, Any]) -> None:
    offered = p["new"] + p["duplicates"] + p["fresh"] + p["already_dead"] + p["refused"]
    ledger.planned(
        p["kind"],
        discovered=offered + p["adopted"],
        duplicates=p["duplicates"],
        fresh_skipped=p["fresh"],
        already_dead=p["already_dead"],
        refused=p["refused"],
        carried_over=p["carried"],
        retired=p["retired"],
    )
    model.counts["queued"] += p["new"] + p["adopted"] + p["carried"]
    model.counts["done"] += p["fresh"]
    model.counts["dead"] += p["already_dead"]
    model.counts["retired"] += p["retired"]


def _settle(ledger: Ledger, model: _Model, split: list[int]) -> None:
    """Settle the oldest claim: its items stored, dead, returned, deferred, and stale (taken
    over by a helper, who stored them); what the split does not cover is returned."""
    if not model.mine:
        return
    items = model.mine.pop(0)
    parts, left = [], items
    for want in split[:4]:
        take = min(want, left)
        parts.append(take)
        left -= take
    stored, dead, deferred, stale = parts
    returned = left
    model.counts["leased"] -= items
    model.counts["done"] += stored + stale
    model.counts["dead"] += dead
    model.counts["queued"] += returned + deferred
    ledger.settled(
        items,
        Account(
            stored=stored,
            dead_lettered=dead,
            returned=returned,
            deferred_by_circuit=deferred,
            stale_acks=stale,
            retried=min(returned, split[4]),
            records_written=stored,
            batches=1,
        ),
    )


def _run(plan: dict[str, Any], steps: list[tuple[str, Any]]) -> Ledger:
    ledger, model = Ledger(), _Model()
    _plan(ledger, model, plan)
    for step, arg in steps:
        if step == "claim":
            n = model.move("queued", "leased", arg)
            if n:
                model.mine.append(n)
                ledger.took(n)
        elif step == "settle":
            _settle(ledger, model, arg)
        elif step == "fail" and model.mine:  # a batch's task failed: given back unchanged
            ledger.gave_back(model.move("leased", "queued", model.mine.pop()))
        elif step == "expire":
            model.move("queued", "expired", arg)
        elif step == "helper":  # a `collector work` helper stores some queued items
            model.move("queued", "done", arg)
        elif step == "helper_holds":  # ... or still holds them when the run ends
            model.move("queued", "leased", arg)
        elif step == "reclaim":
            ledger.reclaimed(arg)
    # the end of the drain: the run's own leases are revoked and counted as given back
    ledger.gave_back(model.move("leased", "queued", sum(model.mine)))
    ledger.close(model.final())
    return ledger


@settings(max_examples=300, deadline=None)
@given(_plans, _steps)
def test_any_sequence_of_ledger_steps_keeps_the_balance(
    plan: dict[str, Any], steps: list[tuple[str, Any]]
) -> None:
    ledger = _run(plan, steps)
    assert ledger.balanced, ledger.problems
    values = ledger.values()
    # the balance, read off the definition's signs
    assert sum(values[t.name] * t.balance for t in TERMS) == 0
    assert sum(values[t.name] * t.claims for t in TERMS) == 0


def test_a_miscount_is_named_in_the_generated_equation() -> None:
    """A term the frontier disagrees with fails the balance, in a line naming every term."""
    ledger = Ledger()
    ledger.planned("full", discovered=3)
    ledger.took(3)
    ledger.settled(3, Account(stored=3, batches=1))
    ledger.close(StateCounts(done=2, queued=1))  # the frontier says one is still queued
    assert not ledger.balanced
    equation = next(p for p in ledger.problems if p.startswith("discovered"))
    for t in (*INTAKE_TERMS, *END_TERMS):
        assert f"{t.name} " in equation


_counts = st.integers(0, 10_000)
_accounts = st.builds(
    Account,
    **{t.name: _counts for t in TERMS},
    plan=st.sampled_from(["", "full", "incremental", "difference"]),
)


def _summary(account: Account, **how: Any) -> RunSummary:
    return RunSummary(source="s", run_id="r", **account.values(), **how)


@settings(max_examples=100, deadline=None)
@given(_accounts)
def test_the_summary_and_json_show_every_term(account: Account) -> None:
    summary = _summary(account)
    assert summary.ledger == account
    line = json.loads(_json_line(summary, None))
    assert list(line)[:3] == ["source", "run_id", "role"]
    for t in TERMS:
        assert getattr(summary, t.name) == line[t.name] == getattr(account, t.name), t.name
    assert RunSummary.from_dict(summary.as_dict()) == summary


@settings(max_examples=100, deadline=None)
@given(_accounts)
def test_the_artifact_table_shows_every_balance_and_reported_term(account: Account) -> None:
    rows = ledger_artifact_rows(_summary(account))
    shown = {row["count"]: row["value"] for row in rows}
    assert len(shown) == len(rows)  # no term twice
    wanted = [t.name for t in (*INTAKE_TERMS, *END_TERMS, *REPORTED_TERMS)]
    assert [row["count"] for row in rows[: len(wanted)]] == wanted
    for name in wanted:
        assert shown[name] == getattr(account, name)
    assert {"requests", "pages_per_second", "balanced", "ended"} <= set(shown)


@settings(max_examples=100, deadline=None)
@given(_accounts)
def test_the_cli_table_shows_each_term_as_defined(account: Account) -> None:
    summary = _summary(account)
    rows = ledger_rows(summary)
    line = rows.index(None)
    above = {row[0]: row for row in rows[:line] if row}
    below = {row[0]: row for row in rows[line + 1 :] if row}
    for terms, where in ((END_TERMS, above), (INTAKE_TERMS, below)):
        for t in terms:
            count = getattr(account, t.name)
            shown = t.table == "always" or (t.table == "nonzero" and count > 0)
            assert (t.name in where) == shown, t.name
            if shown:
                assert where[t.name][1] == str(count)
                if count and t.note:
                    assert where[t.name][2] == t.note
    assert not set(above) & {t.name for t in TERMS if not t.balance}
    assert below["[bold]total"][1] == f"[bold]{summary.discovered + summary.unlisted}"
    # every terminal state the definition has is in the table whenever it is not zero
    assert sum(int(row[1]) for row in above.values()) == sum(
        getattr(account, t.name) for t in END_TERMS
    )


def test_the_definition_is_complete() -> None:
    """Every count of the account is a term with a meaning; the claims check has both sides."""
    names = {t.name for t in TERMS}
    assert set(Account.__dataclass_fields__) - names == {"plan", "problems"}
    assert all(t.meaning for t in TERMS)
    assert {t.claims for t in CLAIM_TERMS} == {-1, 1}
    assert [t.name for t in INTAKE_TERMS] == ["discovered", "unlisted"]


def test_a_ledger_is_changed_only_through_its_steps() -> None:
    ledger = Ledger()
    with pytest.raises(FrozenInstanceError):
        ledger.stored = 1  # type: ignore[misc]
    ledger.planned("full", discovered=2, fresh_skipped=1)
    with pytest.raises(ConservationError, match="internal error: the ledger's plan step"):
        ledger.planned("full", discovered=1)  # twice
    with pytest.raises(ConservationError, match="internal error: the ledger's batch step"):
        ledger.settled(3, Account(stored=1, returned=1))  # one of the three items ended nowhere
    with pytest.raises(ConservationError, match="internal error: the ledger's plan step"):
        Ledger().planned("full", discovered=1, fresh_skipped=1, refused=1)
    with pytest.raises(ConservationError, match="would change by -1"):
        ledger.gave_back(-1)
    assert ledger.stored == 0 and ledger.batches == 0  # nothing counted by the refused steps
