"""The collect flow as real Prefect flow runs against the real local fault site.

Every ledger count is asserted exactly, and checked against the sink's files, the dead-letter
store and the site's own request log, so a count that is right by accident does not pass.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from prefect.client.schemas.objects import State, TaskRun

from collector.config import load_source
from collector.deadletter import SqliteDeadLetterStore
from collector.demo.scenario import DEMO_ITEMS, EXPECTED, write_demo_source
from collector.demo.site import FaultSite
from collector.errors import CollectorError, RunFailed
from collector.run.summary import RunSummary
from flows.collect import collect
from tests.helpers import duplicate_keys, sink_lines, summary_of, write_source

pytestmark = pytest.mark.usefixtures("prefect_api")

TERMINAL = ("discovered", "stored", "fresh_skipped", "expired", "dead_lettered", "queued")


def _terminal(summary: dict[str, Any]) -> dict[str, Any]:
    return {name: summary[name] for name in TERMINAL}


async def test_demo_source_ends_every_item_in_its_expected_state(
    tmp_path: Path, site: FaultSite
) -> None:
    source_path = write_demo_source(tmp_path, site.base_url)
    summary = summary_of(await collect(source=str(source_path), batch_size=50))

    assert _terminal(summary) == EXPECTED
    assert summary["balanced"] is True
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == EXPECTED["stored"] == summary["records_in_sink"]
    assert duplicate_keys(rows) == []
    keys = {row["id"] for row in rows}
    assert keys == set(range(DEMO_ITEMS)) | {1001, 1002, 1003, 2008}  # 2008 came via redirect

    # What the site saw: permanent errors fetched once, recoverable ones retried.
    assert site.request_count("/missing/1007.json") == 1
    assert site.request_count("/items/1005.json?malformed=1") == 1
    assert site.request_count("/items/1006.json?invalid=1") == 1
    assert site.request_count("/items/1009.json?status=500") == 3  # max_attempts
    assert site.request_count("/items/1001.json?status=429") == 2  # 429, then 200
    assert site.request_count("/items/1002.json?status=503&times=2") == 3
    # (the slow URL's attempts are checked on its dead letter: the site logs a response when it
    # is sent, 5 s later, after the client gave up)

    source = load_source(source_path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        reasons = store.reasons(source.name)
    finally:
        store.close()
    assert reasons == {
        "fetch/http_404": 1,
        "fetch/retries_exhausted:http_500": 1,
        "fetch/retries_exhausted:timeout": 1,
        "parse/parse_error": 1,
        "validate/schema": 1,
    }
    slow = store_entries = None
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        store_entries = store.list(source=source.name, error_class="timeout")
    finally:
        store.close()
    assert len(store_entries) == 1
    slow = store_entries[0]
    assert slow.url.endswith("/items/1004.json?delay=5") and slow.attempts == 3
    archive = source.deadletter_archive_path.read_text(encoding="utf-8").splitlines()
    assert len(archive) == 5


async def test_rerun_skips_fresh_items_and_writes_nothing_twice(
    tmp_path: Path, site: FaultSite
) -> None:
    source_path = write_demo_source(tmp_path, site.base_url)
    first = summary_of(await collect(source=str(source_path), batch_size=64))
    assert first["balanced"]
    site.reset()

    second = summary_of(await collect(source=str(source_path), batch_size=64))

    # The seed list did not change: the plan offers nothing and nothing is due (all fresh or
    # dead), so the run's account is empty and balanced.
    assert second["plan"] == "incremental" and second["balanced"]
    assert _terminal(second) == dict.fromkeys(TERMINAL, 0)
    assert second["requests"] == 0

    # An edit of the seed file (a comment: same URLs) is a changed list: offered in full, and
    # every item is where the first run left it.
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(seeds.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    third = summary_of(await collect(source=str(source_path), batch_size=64))

    # Relative to the first run, not the demo's exact counts (asserted elsewhere): on a loaded
    # machine an item may exhaust its retries there, and this test is about the rerun.
    assert first["stored"] + first["dead_lettered"] == EXPECTED["discovered"]
    assert third["plan"] == "full" and third["balanced"]
    assert _terminal(third) == {
        "discovered": EXPECTED["discovered"],
        "stored": 0,
        "fresh_skipped": first["stored"],
        "expired": 0,
        "dead_lettered": first["dead_lettered"],  # still waiting for triage
        "queued": 0,
    }
    assert third["already_dead"] == first["dead_lettered"]
    assert third["requests"] == 0 and (third["retired"], third["carried_over"]) == (0, 0)
    # The site logs a response when it is sent: the slow URL's last answer from the first run
    # (abandoned by its deadline) may land after the reset, so it is not counted here.
    assert [r.path for r in site.requests if "delay=" not in r.path] == []
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == first["stored"] and duplicate_keys(rows) == []


async def test_stale_items_are_refetched_but_unchanged_records_not_rewritten(
    tmp_path: Path, site: FaultSite
) -> None:
    source_path = write_source(
        tmp_path,
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 30]},
        ttl={"default_fresh_s": 0},
    )
    await collect(source=str(source_path))
    site.reset()
    again = summary_of(await collect(source=str(source_path)))

    assert _terminal(again) == {
        "discovered": 30, "stored": 30, "fresh_skipped": 0,
        "expired": 0, "dead_lettered": 0, "queued": 0,
    }  # fmt: skip
    assert again["records_written"] == 0 and again["records_unchanged"] == 30
    assert site.request_count("/items/") == 30
    assert site.request_count("/robots.txt") == 1  # once per host and run (a 404: allow all)
    assert len(sink_lines(tmp_path / "out")) == 30


async def test_batch_size_one_gives_one_task_run_per_url(tmp_path: Path, site: FaultSite) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    source_path = write_source(
        tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 7]}
    )
    summary = summary_of(await collect(source=str(source_path), batch_size=1))
    assert summary["stored"] == 7 and summary["batches"] == 7

    # Task runs reach the API through events, recorded asynchronously: poll briefly.
    fetches: list[TaskRun] = []
    async with get_client() as client:
        for _ in range(100):
            task_runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=[uuid.UUID(summary["run_id"])])
                )
            )
            fetches = [run for run in task_runs if run.name.startswith("fetch-batch")]
            if len(fetches) == 7 and all(r.state and r.state.is_completed() for r in fetches):
                break
            await asyncio.sleep(0.1)
    assert len(fetches) == 7
    assert all(run.state is not None and run.state.is_completed() for run in fetches)


async def test_max_items_leaves_the_rest_queued_and_the_next_run_finishes(
    tmp_path: Path, site: FaultSite
) -> None:
    source_path = write_source(
        tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 50]}
    )
    first = summary_of(await collect(source=str(source_path), batch_size=8, max_items=20))
    assert _terminal(first) == {
        "discovered": 50, "stored": 20, "fresh_skipped": 0,
        "expired": 0, "dead_lettered": 0, "queued": 30,
    }  # fmt: skip
    second = summary_of(await collect(source=str(source_path), batch_size=8))
    # the seed list is unchanged: an incremental plan takes the 30 queued items, nothing else
    assert second["plan"] == "incremental"
    assert _terminal(second) == {
        "discovered": 30, "stored": 30, "fresh_skipped": 0,
        "expired": 0, "dead_lettered": 0, "queued": 0,
    }  # fmt: skip
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == 50 and duplicate_keys(rows) == []


async def test_jobs_past_their_queue_ttl_are_expired_and_counted(
    tmp_path: Path, site: FaultSite
) -> None:
    source_path = write_source(
        tmp_path,
        seeds={"template": site.url("/items/{i}.json"), "range": [0, 12]},
        ttl={"queue_ttl_s": 0.000001},
    )
    summary = summary_of(await collect(source=str(source_path)))
    assert _terminal(summary) == {
        "discovered": 12, "stored": 0, "fresh_skipped": 0,
        "expired": 12, "dead_lettered": 0, "queued": 0,
    }  # fmt: skip
    assert summary["balanced"] and site.request_count() == 0
    # Expired jobs are planned again by the next run (with a sane queue TTL).
    source_path = write_source(
        tmp_path, seeds={"template": site.url("/items/{i}.json"), "range": [0, 12]}
    )
    again = summary_of(await collect(source=str(source_path)))
    assert again["stored"] == 12 and again["expired"] == 0


async def test_retry_later_items_are_waited_for_within_drain_wait(
    tmp_path: Path, site: FaultSite
) -> None:
    # Retry-After 3 s is longer than max_inline_delay_s, so the item goes back to the frontier
    # with a not-before time; the run waits for it and stores it.
    source_path = write_source(
        tmp_path,
        seeds={"urls": [site.url("/items/1.json?status=429&retry_after=3")]},
        retry={"max_inline_delay_s": 0.5, "base_s": 0.05},
    )
    summary = summary_of(await collect(source=str(source_path), drain_wait_s=10))
    assert summary["stored"] == 1 and summary["retried"] == 1 and summary["balanced"]
    hits = [r for r in site.requests if r.path.startswith("/items/1.json")]
    assert len(hits) == 2 and hits[1].at - hits[0].at >= 2.9


async def test_refused_urls_are_dead_lettered_at_plan_without_a_request(
    tmp_path: Path, site: FaultSite
) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(site.url("/items/1.json") + "\n", encoding="utf-8")
    source_path = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1:9/x.json", "http://10.1.2.3/y.json"]},
        allow_private_networks=False,
    )
    # every seed refused: the source can collect nothing, so the run ends Failed (noticed by
    # the automations), with its summary as the state's data
    state = await collect(source=str(source_path), return_state=True)
    assert isinstance(state, State) and state.is_failed()
    assert (state.message or "").startswith("every seed URL of test-items was refused at plan (2)")
    failure = await state.aresult(raise_on_failure=False)
    assert isinstance(failure, RunFailed)  # the state's data: the exception, summary carried
    summary = failure.summary
    assert _terminal(summary) == {
        "discovered": 2, "stored": 0, "fresh_skipped": 0,
        "expired": 0, "dead_lettered": 2, "queued": 0,
    }  # fmt: skip
    assert summary["refused_at_plan"] == 2 and summary["balanced"]
    assert summary["deadletter_reasons"] == {"plan/refused_url": 2}


async def test_calling_the_flow_on_a_run_that_ends_failed_raises_run_failed(
    tmp_path: Path,
) -> None:
    """In process, a Failed run raises a CollectorError carrying the summary (Prefect used to
    raise its own TypeError: a dict in a Failed state cannot be resolved into an exception)."""
    source_path = write_source(
        tmp_path, seeds={"urls": ["http://10.1.2.3/y.json"]}, allow_private_networks=False
    )
    with pytest.raises(RunFailed, match="every seed URL of test-items was refused") as failed:
        await collect(source=str(source_path))
    assert isinstance(failed.value, CollectorError)
    assert failed.value.summary["refused_at_plan"] == 1 and failed.value.summary["balanced"]
    assert RunSummary.from_dict(failed.value.summary).all_refused


async def test_artifacts_are_published(tmp_path: Path, site: FaultSite) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    source_path = write_source(
        tmp_path,
        name="artifact-check",
        seeds={"urls": [site.url("/items/1.json"), site.url("/missing/2.json")]},
    )
    await collect(source=str(source_path))
    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(
                    any_=[
                        "collector-artifact-check-progress",
                        "collector-artifact-check-summary",
                        "collector-artifact-check-deadletters",
                    ]
                )
            )
        )
    by_type = {a.type: a for a in artifacts}
    assert set(by_type) >= {"progress", "table", "markdown"}
    assert "fetch/http_404" in str(by_type["markdown"].data)
    progress = by_type["progress"].data
    assert isinstance(progress, (int, float)) and float(progress) == 100.0


async def test_secrets_never_reach_the_dead_letters(
    tmp_path: Path, site: FaultSite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEMO_API_TOKEN", "s3cr3t-value-123")
    source_path = write_source(
        tmp_path,
        seeds={"urls": [site.url("/missing/1.json?api_key=s3cr3t-value-123&page=2")]},
        limits={"headers": {"Authorization": "Bearer ${env:DEMO_API_TOKEN}"}},
    )
    summary = summary_of(await collect(source=str(source_path)))
    assert summary["dead_lettered"] == 1
    source = load_source(source_path)
    # The dead-letter database (with its WAL) and archive; the frontier keeps the real URL,
    # because it has to fetch it.
    for written in source.state_path.glob("deadletters*"):
        if written.is_file():
            assert b"s3cr3t-value-123" not in written.read_bytes(), written
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        (entry,) = store.list(source=source.name)
    finally:
        store.close()
    assert "api_key=%5Bredacted%5D" in entry.url or "api_key=[redacted]" in entry.url
    assert "page=2" in entry.url


async def test_dead_letters_can_live_in_redis(
    tmp_path: Path, site: FaultSite, redis_url: str
) -> None:
    from collector.deadletter.redis import RedisDeadLetterStore

    source_path = write_source(
        tmp_path,
        seeds={"urls": [site.url("/items/1.json"), site.url("/missing/2.json")]},
        deadletters={"type": "redis", "url": redis_url},
    )
    summary = summary_of(await collect(source=str(source_path)))
    assert summary["stored"] == 1 and summary["dead_lettered"] == 1 and summary["balanced"]
    store = RedisDeadLetterStore(redis_url)
    try:
        (entry,) = store.list(source="test-items")
    finally:
        store.close()
    assert entry.error_class == "http_404" and entry.url.endswith("/missing/2.json")


def test_an_unreachable_redis_stops_the_run_at_once_with_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.servers import free_port

    source_path = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1:9/x.json"]},
        deadletters={"type": "redis", "url": f"redis://:hunter2@127.0.0.1:{free_port()}/0"},
    )
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", str(source_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("collector:")]
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"collector: {source_path}: deadletters.url redis://"), lines
    assert "cannot connect" in lines[0]
    assert "hunter2" not in done.stderr


async def test_the_whole_run_on_redis_backends_balances_and_reruns(
    tmp_path: Path, site: FaultSite, redis_url: str
) -> None:
    source_path = write_demo_source(tmp_path, site.base_url)
    text = source_path.read_text(encoding="utf-8")
    source_path.write_text(
        text
        + f"frontier: {{type: redis, url: '{redis_url}'}}\n"
        + f"deadletters: {{type: redis, url: '{redis_url}'}}\n",
        encoding="utf-8",
    )
    first = summary_of(await collect(source=str(source_path), batch_size=40))
    assert _terminal(first) == EXPECTED and first["balanced"]
    second = summary_of(await collect(source=str(source_path), batch_size=40))
    assert second["plan"] == "incremental" and second["balanced"]
    assert _terminal(second) == dict.fromkeys(TERMINAL, 0)
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(seeds.read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    third = summary_of(await collect(source=str(source_path), batch_size=40))
    assert third["plan"] == "full"
    assert third["fresh_skipped"] == EXPECTED["stored"] and third["stored"] == 0
    assert third["already_dead"] == EXPECTED["dead_lettered"] and third["balanced"]
    rows = sink_lines(tmp_path / "out")
    assert len(rows) == EXPECTED["stored"] and duplicate_keys(rows) == []
