"""A template whose range changed is planned by its difference (real Collection, real frontiers).

Only the numbers the range gained are offered, the URLs of the numbers it lost are settled as a
sweep would (retired, or carried over with ``on_removed: collect``), and the rest joins the run as
in an unchanged plan. Every run balances against the frontier.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.config import load_source
from collector.frontier.base import StateCounts
from collector.run.collection import Collection
from collector.run.ledger import Ledger
from collector.run.seeds import range_change
from tests.helpers import write_source

TEMPLATE = "https://items.example.test/items/{i}.json"


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "redis":
        return {"frontier": {"type": "redis", "url": request.getfixturevalue("redis_url")}}
    return {}


def _plan_seeds(
    folder: Path, backend: dict[str, Any], run: str, seeds: dict[str, Any]
) -> tuple[Ledger, StateCounts]:
    """One plan of a source with these seeds, finished at once; its ledger (balanced) and the
    frontier's counts after it."""
    path = write_source(folder, seeds=seeds, state_dir="state", **backend)
    source = load_source(path)
    with Collection(source, run_id=run) as collection:
        collection.plan()
        ledger = collection.finish()
        assert ledger.balanced, ledger.problems
        return ledger, collection.frontier.counts(source.name)


def _plan(
    folder: Path, backend: dict[str, Any], run: str, start: int, stop: int, **seeds: Any
) -> tuple[Ledger, StateCounts]:
    return _plan_seeds(
        folder, backend, run, {"template": TEMPLATE, "range": [start, stop], **seeds}
    )


def test_a_grown_range_offers_only_the_new_numbers(tmp_path: Path, backend: dict[str, Any]) -> None:
    first, counts = _plan(tmp_path, backend, "r1", 0, 100)
    assert (first.plan, first.discovered, counts.queued) == ("full", 100, 100)
    grown, counts = _plan(tmp_path, backend, "r2", 0, 150)
    # 50 offered (new), the 100 still queued join the run as in an unchanged plan
    assert (grown.plan, grown.discovered, grown.queued, counts.queued) == (
        "difference", 150, 150, 150
    )  # fmt: skip


def test_a_shrunk_range_settles_only_the_numbers_it_lost(
    tmp_path: Path, backend: dict[str, Any]
) -> None:
    _plan(tmp_path, backend, "r1", 0, 150)
    shrunk, counts = _plan(tmp_path, backend, "r2", 20, 150)
    assert (shrunk.plan, shrunk.unlisted, shrunk.retired, shrunk.discovered) == (
        "difference", 20, 20, 130
    )  # fmt: skip
    assert counts == StateCounts(queued=130, retired=20)
    # listed again: the retired ones are queued again, nothing else is offered
    back, counts = _plan(tmp_path, backend, "r3", 0, 150)
    assert (back.plan, back.discovered, back.unlisted) == ("difference", 150, 0)
    assert counts == StateCounts(queued=150)
    # a moved window with on_removed: collect carries the lost ones over (a full plan first:
    # the policy is part of the mark)
    _plan(tmp_path, backend, "r4", 0, 150, on_removed="collect")
    moved, counts = _plan(tmp_path, backend, "r5", 100, 200, on_removed="collect")
    assert (moved.plan, moved.unlisted, moved.carried_over, moved.retired) == (
        "difference", 100, 100, 0
    )  # fmt: skip
    assert (moved.discovered, counts.queued) == (100, 200)


def test_anything_but_the_range_changed_plans_in_full(tmp_path: Path) -> None:
    _plan(tmp_path, {}, "r1", 0, 10)
    edited = _plan(tmp_path, {}, "r2", 0, 20, urls=["https://items.example.test/x"])[0]
    assert edited.plan == "full"


numbers = st.integers(-5, 30)


@given(numbers, numbers, numbers, numbers)
def test_range_change_is_the_exact_difference(a: int, b: int, c: int, d: int) -> None:
    old, new = range(a, max(a, b)), range(c, max(c, d))
    change = range_change(
        f"sha256:x range={old.start},{old.stop}", f"sha256:x range={new.start},{new.stop}"
    )
    assert change is not None
    added = [i for part in change.added for i in part]
    removed = [i for part in change.removed for i in part]
    assert sorted(added) == sorted(set(new) - set(old)) and len(added) == len(set(added))
    assert sorted(removed) == sorted(set(old) - set(new)) and len(removed) == len(set(removed))


def test_range_change_needs_the_same_rest() -> None:
    assert range_change(None, "sha256:x range=0,5") is None
    assert range_change("sha256:x range=0,5", "sha256:y range=0,6") is None
    assert range_change("sha256:x", "sha256:x range=0,6") is None
    assert range_change("sha256:x range=zero,5", "sha256:x range=0,6") is None


# --- a seed file edited between runs (collector.run.seedlist) ------------------------------
def _url(n: int) -> str:
    return TEMPLATE.format(i=n)


def _plan_file(
    folder: Path, backend: dict[str, Any], run: str, lines: list[str], **seeds: Any
) -> tuple[Ledger, StateCounts]:
    (folder / "seeds.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return _plan_seeds(folder, backend, run, {"file": "seeds.txt", **seeds})


def test_an_edited_seed_file_offers_the_changed_lines_only(
    tmp_path: Path, backend: dict[str, Any]
) -> None:
    lines = [_url(n) for n in range(100)]
    first, counts = _plan_file(tmp_path, backend, "r1", lines)
    assert (first.plan, first.discovered, counts.queued) == ("full", 100, 100)
    # 10 appended, 5 removed from the middle, one of them listed twice (stays), one moved
    edited = lines[:40] + lines[45:] + [_url(n) for n in range(100, 110)]
    edited[0:0] = [_url(44)]  # 44 moved to the top: still listed
    edited.append(_url(40))  # 40 repeated at the end: still listed
    second, counts = _plan_file(tmp_path, backend, "r2", edited)
    assert (second.plan, second.unlisted, second.retired) == ("difference", 3, 3)
    assert counts == StateCounts(queued=107, retired=3)
    assert second.discovered == 107  # the new and moved lines offered, the rest adopted (queued)


def test_a_seed_file_whose_copy_is_not_here_plans_in_full(tmp_path: Path) -> None:
    lines = [_url(n) for n in range(20)]
    _plan_file(tmp_path, {}, "r1", lines)
    kept = list((tmp_path / "state" / "seedlists" / "test-items").iterdir())
    assert [p.suffix for p in kept] == [".list"]
    kept[0].unlink()  # a wiped state_dir, or the last plan ran on another machine
    second, counts = _plan_file(tmp_path, {}, "r2", lines[:10])
    assert (second.plan, second.retired, counts.queued) == ("full", 10, 10)
    third, counts = _plan_file(tmp_path, {}, "r3", lines[:5])
    assert (third.plan, third.retired, counts.queued) == ("difference", 5, 5)


_PLAN_ONLY = """
import sys
from collector.config import load_source
from collector.run.collection import Collection
with Collection(load_source(sys.argv[1]), run_id="killed") as run:
    run.plan()
"""


def test_a_difference_plan_killed_midway_is_made_whole_by_the_next_plan(tmp_path: Path) -> None:
    """SIGKILL while an edited file's new lines are offered: the mark was cleared, so the next
    plan is a full one from a fresh copy, and every URL of either list ends where it should."""
    old = [_url(n) for n in range(1_000)]
    _plan_file(tmp_path, {}, "r1", old[:])
    new = old[500:] + [_url(n) for n in range(1_000, 151_000)]  # 500 left, 150,000 joined
    (tmp_path / "seeds.txt").write_text("".join(f"{u}\n" for u in new), encoding="utf-8")
    path = tmp_path / "source.yaml"
    proc = subprocess.Popen([sys.executable, "-c", _PLAN_ONLY, str(path)], cwd=Path.cwd())
    try:
        db = tmp_path / "state" / "frontier.db"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            with sqlite3.connect(db, timeout=30) as peek:
                if peek.execute("SELECT count(*) FROM items").fetchone()[0] > 10_000:
                    break  # the difference plan is offering the new lines
            time.sleep(0.05)
        assert proc.poll() is None, "the plan ended before it could be killed: make it longer"
        proc.kill()
    finally:
        proc.wait()
    assert (tmp_path / "state" / "seedlists" / "test-items" / "pending").exists()
    source = load_source(path)
    with Collection(source, run_id="r3") as collection:
        assert collection.frontier.plan_mark(source.name) is None  # cleared before the offers
        ledger = collection.plan()
        assert ledger.plan == "full"
        ledger = collection.finish()
        assert ledger.balanced, ledger.problems
        counts = collection.frontier.counts(source.name)
    assert counts == StateCounts(queued=150_500, retired=500)
    kept = [p.name for p in (tmp_path / "state" / "seedlists" / "test-items").iterdir()]
    assert kept == [f"{source.seed_mark().rpartition('=')[2]}.list"]
