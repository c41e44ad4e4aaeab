"""State a process keeps across its runs stays bounded: a long-lived worker or served process that
sees many secrets, runs and concurrency limits keeps at most the stated number of each."""

from __future__ import annotations

import uuid

import pytest

from collector.ops import metrics, scrub


def test_the_secrets_a_process_knows_are_bounded_and_the_recent_ones_scrubbed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(scrub, "_known", {})
    monkeypatch.setattr(scrub, "_process_scrubber", scrub.Scrubber())
    # the rule, not the size: a scrubber of 1,024 secrets takes ~16 ms to build, and this
    # rotates past the bound (20 s at the real size; one build per run in a real process)
    monkeypatch.setattr(scrub, "SECRETS_KEPT", 32)
    kept = "kept-secret-in-use-by-every-run"
    first = "first-rotated-secret-0000"
    scrub.remember_secrets([first, kept])
    for n in range(scrub.SECRETS_KEPT + 200):  # a secret that rotates at every run
        scrub.remember_secrets([f"rotated-secret-{n:06d}", kept])
    assert len(scrub._known) == scrub.SECRETS_KEPT
    scrubbed = scrub.process_scrubber().text
    assert scrubbed(f"x {kept} y") == f"x {scrub.REDACTED} y"  # given at every run: kept
    newest = f"rotated-secret-{scrub.SECRETS_KEPT + 199:06d}"
    assert scrubbed(newest) == scrub.REDACTED
    assert scrubbed(first) == first  # the oldest, out of use: forgotten


def test_runs_that_never_end_do_not_pile_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_runs", {})
    for n in range(metrics.RUNS_KEPT + 50):
        metrics.run_started(f"run-{n}", "src", "run")
    assert len(metrics._runs) == metrics.RUNS_KEPT
    assert "run-0" not in metrics._runs and f"run-{metrics.RUNS_KEPT + 49}" in metrics._runs
    metrics.run_ended(f"run-{metrics.RUNS_KEPT + 49}", "ok")
    assert len(metrics._runs) == metrics.RUNS_KEPT - 1


def test_host_labels_stay_within_the_quota_whatever_the_hosts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics, "_hosts", {})
    monkeypatch.setattr(metrics, "_named", {})
    monkeypatch.setattr(metrics, "_max_hosts", 5)
    labels = {metrics.host_label("src", f"h{n}.example", named=10) for n in range(10_000)}
    assert labels == {*(f"h{n}.example" for n in range(5)), "other"}
    assert len(metrics._hosts) == 5


async def test_limit_sizes_a_process_reads_are_bounded(
    prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One limit a host: a process that sees many hosts reads their sizes once each but keeps
    only the most recently used (here 4), and reads a forgotten one again."""
    from cachetools import LRUCache
    from prefect.client.orchestration import get_client

    from flows import _locks

    monkeypatch.setattr(_locks, "_limits_seen", LRUCache(maxsize=4))
    names = [f"bound-{uuid.uuid4().hex[:8]}-{n}" for n in range(12)]
    try:
        for n, name in enumerate(names):
            assert await _locks.ensure_limit(name, n + 1) == n + 1
            assert len(_locks._limits_seen) <= 4
        assert set(_locks._limits_seen) == set(names[-4:])
        assert await _locks.ensure_limit(names[0], 99) == 1  # read again: the server's size
    finally:
        async with get_client() as client:
            for name in names:
                await client.delete_global_concurrency_limit_by_name(name)
