"""Traps a new user fell into on a fifth trial from outside (init, run, status, review, a
deleted sink, a renamed source): each now says in one line what is wrong and where."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from collector.backends import open_deadletters
from collector.config import load_source
from collector.deadletter import DeadLetter
from flows.cli import main
from tests.helpers import write_source


def test_a_source_given_by_its_name_or_misspelt_names_the_file_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_source(tmp_path).rename(tmp_path / "shop.yaml")
    (tmp_path / "shop.suite.json").write_text("{}", encoding="utf-8")  # not a source
    for given, hint in [
        ("shop", f"{tmp_path}/shop.yaml is there: give the source's file, not its name"),
        ("shpo.yaml", f"did you mean {tmp_path}/shop.yaml?"),
    ]:
        assert main(["status", str(tmp_path / given)]) == 2
        assert capsys.readouterr().err == f"{tmp_path / given}: file not found ({hint})\n"
    assert main(["validate", str(tmp_path / "other.yaml")]) == 2  # nothing like it: no guess
    assert capsys.readouterr().err == f"{tmp_path / 'other.yaml'}: file not found\n"


def test_accepting_as_is_an_entry_that_kept_no_record_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Triage escalates a 404 with the records that failed their suite; `--accept-as-is` took
    it next and said "the record has no usable key at 'id'" of a page that had no record."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/items/4.json"]})
    source = load_source(path)
    now = time.time()
    gone = DeadLetter(source=source.name, url="http://127.0.0.1:9/items/4.json", stage="fetch",
                      error_class="http_404", message="HTTP 404 Not Found", attempts=1,
                      first_seen=now, last_seen=now, payload={"http_status": 404})  # fmt: skip
    with open_deadletters(source) as store:
        store.put([gone])
        assert store.escalate(gone.id, "not recoverable by triage")
    assert main(["review", str(path), "--accept-as-is"]) == 1
    said = capsys.readouterr().out.splitlines()[-1]
    assert said == (
        f"refused, put back: entry {gone.id[:12]} is a fetch failure (http_404): it kept no record"
        " to accept as is; give one (--accept JSON|@FILE), --discard REASON, or fetch its page"
        " again (`collector deadletters retry`)"
    )
    with open_deadletters(source) as store:
        entry = store.get(gone.id)
    assert entry is not None and entry.status == "review"  # still waiting for a person
