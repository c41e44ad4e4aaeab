"""The ledger of a drain-only worker, and of a run that other workers helped."""

from __future__ import annotations

from collector.frontier.base import StateCounts
from collector.run.ledger import Ledger


def test_a_worker_balances_over_what_it_claimed() -> None:
    ledger = Ledger(claimed=10, stored=5, dead_lettered=1, returned=2, stale_acks=1, released=1)
    ledger.close_claims()
    assert ledger.balanced


def test_a_worker_that_lost_an_item_does_not_balance() -> None:
    ledger = Ledger(claimed=10, stored=5, dead_lettered=1, returned=2, stale_acks=1)
    ledger.close_claims()
    assert not ledger.balanced
    assert "claimed 10" in ledger.problems[0] and "(= 9)" in ledger.problems[0]


def test_a_run_counts_what_helpers_settled_of_its_items() -> None:
    ledger = Ledger(discovered=10, fresh_skipped=1, claimed=4, stored=3, returned=1)
    ledger.close(StateCounts(queued=1, leased=1, done=7, dead=1))
    assert ledger.balanced, ledger.problems
    counted = (ledger.stored_by_others, ledger.dead_by_others, ledger.queued, ledger.held_by_others)
    assert counted == (3, 1, 1, 1)  # the leased item is a helper's: held by others, not queued


def test_a_run_that_counted_more_than_the_frontier_holds_does_not_balance() -> None:
    ledger = Ledger(discovered=10, claimed=10, stored=10)
    ledger.close(StateCounts(done=9, queued=1))
    assert ledger.stored_by_others == 0
    assert not ledger.balanced


def test_a_run_accounts_for_unlisted_items_it_retired_or_carried_over() -> None:
    # 10 listed (8 stored, 2 fresh), 5 unlisted: 3 retired, 2 carried over and stored
    ledger = Ledger(
        discovered=10, unlisted=5, retired=3, carried_over=2, fresh_skipped=2, claimed=10, stored=10
    )
    ledger.close(StateCounts(done=12, retired=3))
    assert ledger.balanced, ledger.problems


def test_retired_items_the_frontier_does_not_hold_do_not_balance() -> None:
    ledger = Ledger(discovered=10, unlisted=3, retired=3, claimed=10, stored=10)
    ledger.close(StateCounts(done=10, queued=3))  # the "retired" ones are still queued
    assert not ledger.balanced
    assert any("retired" in problem for problem in ledger.problems)


def test_unlisted_items_left_out_of_the_account_do_not_balance() -> None:
    ledger = Ledger(discovered=10, claimed=10, stored=10)
    ledger.close(StateCounts(done=10, retired=4))  # the sweep's items were not counted
    assert not ledger.balanced
