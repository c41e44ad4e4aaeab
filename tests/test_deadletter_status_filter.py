"""``deadletters list --status`` takes every value the STATUS column can show (a resolved entry
shows how it was resolved: ``re-enqueued``, ``discarded``...), against a real SQLite store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from collector.config import load_source
from collector.deadletter import SqliteDeadLetterStore
from collector.deadletter.base import RESOLUTION_KINDS
from flows.cli import main
from flows.cli.deadletters import STATUSES
from tests.helpers import write_source
from tests.test_cli_terminal import put_letters

SHOWN = {"reenqueued": "re-enqueued"}  # the column's spelling of a resolution kind


@pytest.fixture
def states(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A source whose store holds one entry in each state the column can show: its id by it."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/a"]})
    shown = ["open", "review", *(SHOWN.get(k, k) for k in RESOLUTION_KINDS)]
    ids = put_letters(path, [(f"http://127.0.0.1:9/{s}", "fetch", "http_404") for s in shown])
    source = load_source(path)
    store = SqliteDeadLetterStore(source.deadletter_path)
    try:
        assert store.escalate(ids[1], "a person should look")
        for kind, entry_id in zip(RESOLUTION_KINDS, ids[2:], strict=True):
            assert store.resolve(entry_id, kind, f"{kind} by the test")
    finally:
        store.close()
    return path, dict(zip(shown, ids, strict=True))


def _listed(path: Path, status: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["deadletters", "list", str(path), "--status", status, "--json"]) == 0
    return sorted(e["id"] for e in json.loads(capsys.readouterr().out))


def test_every_value_the_column_shows_filters_to_exactly_those_entries(
    states: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, ids = states
    assert main(["deadletters", "list", str(path), "--status", "all"]) == 0
    table = capsys.readouterr().out.splitlines()[1:]
    column = {line.split()[0]: line.split()[1] for line in table}
    assert column == {entry_id[:12]: shown for shown, entry_id in ids.items()}
    for shown, entry_id in ids.items():
        assert shown in STATUSES
        assert _listed(path, shown, capsys) == [entry_id], shown
    resolved = sorted(i for s, i in ids.items() if s not in ("open", "review"))
    assert _listed(path, "resolved", capsys) == resolved  # still every resolved kind
    assert _listed(path, "all", capsys) == sorted(ids.values())


def test_an_empty_kind_says_where_the_other_entries_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/a"]})
    (entry_id,) = put_letters(path, [("http://127.0.0.1:9/a", "fetch", "http_404")])
    store = SqliteDeadLetterStore(load_source(path).deadletter_path)
    try:
        store.resolve(entry_id, "discarded", "not wanted")
    finally:
        store.close()
    assert main(["deadletters", "list", str(path), "--status", "re-enqueued"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "no dead letters of test-items match (status re-enqueued)",
        "the source has 1 resolved (see --status resolved or --status all)",
    ]


def test_help_lists_every_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["deadletters", "list", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    for shown in ("open", "review", "resolved", "re-enqueued", "discarded", "repaired", "all"):
        assert shown in said
    assert "--status {open,review,resolved,repaired,re-enqueued,escalated,discarded" in said
