"""The fast lane (``./bootstrap test --fast``, ``pytest -m "not slow"``): which tests are slow.

A test is slow, and left to the whole suite, when it starts a Prefect server (it uses the
session's ``prefect_api``: 15-60 s to start on a loaded box, then a flow run per test) or lives
in one of the end-to-end files below (each test runs ``collector`` or Prefect commands as
subprocesses, seconds each), or is one of the few single tests that start a fresh Python (listed
below), or carries ``@pytest.mark.slow`` itself. Everything else (units,
the conformance suites, the Hypothesis properties) is the fast lane. tests/test_lanes.py checks
that every test file has fast tests or is listed there as slow only, on purpose.
"""

from __future__ import annotations

import pytest

END_TO_END_FILES = frozenset({
    "test_cli.py", "test_cli_terminal.py", "test_deploy_e2e.py", "test_init.py",
    "test_lifecycle.py", "test_local_cluster.py", "test_local_server.py",
    "test_local_server_ui.py", "test_lost_footing_cli.py", "test_metrics.py",
    "test_metrics_end_to_end.py", "test_recovery_locks.py", "test_workers.py",
})  # fmt: skip

# Single tests that start a fresh Python that imports the project (an import-hygiene check, a
# writer killed midway): seconds of imports each, in files whose other tests are fast.
SUBPROCESS_TESTS = frozenset({
    "test_config.py::test_cli_validate_does_not_import_prefect",
    "test_validation.py::test_load_and_empty_batch_do_not_import_gx_and_validation_prints_nothing",
    "test_plan_difference.py::test_a_difference_plan_killed_midway_is_made_whole_by_the_next_plan",
    "test_jsonl_sink.py::test_writer_killed_mid_way_leaves_a_sink_that_reopens_clean",
    # each a fresh Python importing GX (3-4 s of CPU apiece, 25-45 s of a loaded lane's wall)
    "test_command_weight.py::test_validate_asks_gx_once_per_suite_content",
    "test_gx_check_cache.py::test_two_processes_filling_the_cache_at_once_both_get_the_verdict",
    "test_validate_all_at_once.py::test_every_problem_at_once_in_file_order",
})  # fmt: skip

# Longest first (the slowest files of a CI run), so none of them starts last and runs alone
# while the other workers have nothing left (each file stays on one worker: --dist loadfile;
# ./bootstrap passes --no-loadscope-reorder, or pytest-xdist would order the files by their
# number of tests and send the one-test fleet file last). A file not listed here is sent after
# every listed one, in collection order: test_warm_start.py (190 s), unlisted, started last and
# ran alone at the end of CI (15 min 14 s at stop 45). Seconds per file: the larger of two
# fresh-clone runs on a quiet box (2026-12-06: 4 workers, 871 s of wall; 5 workers, 734 s).
# `python -m tools.worker_timeline DIR` ends with each file's seconds, worker and start:
# re-measure from it when a file grows.
LONGEST_FIRST = (
    "test_warm_start.py",  # 309
    "test_fleet_flow.py",  # 282
    "test_deploy_e2e.py",  # 269
    "test_cli_terminal.py",  # 268
    "test_fleet_deploy.py",  # 229
    "test_local_server.py",  # 225
    "test_local_cluster.py",  # 178
    "test_workers.py",  # 153
    "test_lost_footing_cli.py",  # 147, most of it waiting for the lock's margin
    "test_operator_truth_4.py",  # 114
    "test_operator_truth.py",  # 93
    "test_domain_slot_recovery.py",  # 75, most of it waiting for a lease to expire
    "test_lifecycle.py",  # 69
    "test_page_is_the_record.py",  # 67
    "test_offloop.py",  # 66
    "test_local_server_ui.py",  # 57
    "test_fetch_ahead.py",  # 54
    "test_init.py",  # 47
    "test_collect_flow.py",  # 46
    "test_recovery_locks.py",  # 42
    "test_redis_restart.py",  # 38
    "test_lost_footing.py",  # 37
    "test_fetch.py",  # 31
    "test_validation_worker_pool.py",  # 30
    "test_adaptive.py",  # 29
    "test_seed_changes.py",  # 25
    "test_metrics_end_to_end.py",  # 24
    "test_prefect_retries.py",  # 24
    "test_quarantine_scenario.py",  # 23
    "test_repaired_page_lives_on.py",  # 22
)

# Test file name -> whether it has a fast test, of everything this session collected (before
# `-m` deselected any): what tests/test_lanes.py checks.
collected: dict[str, bool] = {}


def is_slow(item: pytest.Item) -> bool:
    fixtures = getattr(item, "fixturenames", ())
    return (
        item.path.name in END_TO_END_FILES
        or "prefect_api" in fixtures
        or f"{item.path.name}::{item.name}" in SUBPROCESS_TESTS
    )


def mark_and_order(items: list[pytest.Item]) -> None:
    """Mark the slow tests, record each file's lanes, put the longest files first."""
    for item in items:
        if is_slow(item) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        fast = item.get_closest_marker("slow") is None
        collected[item.path.name] = collected.get(item.path.name, False) or fast
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept
