"""``collector status``: a source's items where they are, read from its own stores (no run).

The stores are filled by the real ``Collection`` steps (SQLite frontier, JSONL sink, SQLite
dead letters); only the fetch is replaced by results built here, as in tests/test_plan_property.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from collector.config import load_source
from collector.fetch.engine import FetchResult
from collector.run.collection import Collection
from flows.cli import main
from tests.helpers import write_source

URLS = [f"https://items.example.test/items/{n}.json" for n in range(5)]


async def _two_stored_three_queued(path: Path) -> None:
    with Collection(load_source(path), run_id="run-1") as run:
        run.plan()
        lease = await run.claim(2)
        now = run.clock()
        await run.settle(
            lease,
            [FetchResult(i.url, "ok", 1, now, i.url, 200, b'{"id": %d}' % n)
             for n, i in enumerate(lease.items)],
        )  # fmt: skip
        run.finish()


def test_status_shows_items_dead_letters_sink_and_the_next_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_source(
        tmp_path, seeds={"urls": [*URLS, "http://127.0.0.1/x"]}, allow_private_networks=False
    )
    asyncio.run(_two_stored_three_queued(path))

    assert main(["status", str(path), "--json"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    items = status["items"]
    assert (items["done"], items["queued"], items["total"]) == (2, 3, 5), items
    assert status["next_plan"] == "incremental"  # the list is unchanged since that plan
    assert status["deadletters"].get("open") == 1  # the private-network seed, refused at plan
    assert list(status["deadletter_reasons"]) == ["plan/refused_url"]
    assert status["records_in_sink"] == 2

    assert main(["status", str(path)]) == 0
    text = capsys.readouterr().out
    assert "queued 3  leased 0  done 2" in text and "only what is due" in text, text

    edited = write_source(tmp_path, seeds={"urls": URLS[:3]}, allow_private_networks=False)
    assert main(["status", str(edited), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["next_plan"] == "full"
