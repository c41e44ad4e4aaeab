"""Traps a new user fell into on a fifth trial from outside (init, run, status, review, a
deleted sink, a renamed source): each now says in one line what is wrong and where."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import pytest

from collector.backends import open_deadletters
from collector.config import load_source
from collector.deadletter import DeadLetter
from collector.errors import PermanentFetchError
from collector.frontier import Completed, DeadLettered, Offer
from collector.frontier.sqlite import SqliteFrontier
from collector.settle.parse import RecordParser
from collector.sinks import SinkRecord
from collector.sinks.jsonl import JsonlSink
from flows.cli import main
from tests.helpers import sink_lines, write_source


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


def _done_pages(path: Path, *urls: str) -> None:
    """The frontier as a run leaves it: ``urls`` fetched, done and fresh for an hour."""
    source = load_source(path)
    now = time.time()
    with SqliteFrontier(source.frontier_path) as frontier:
        frontier.offer(source.name, [Offer(u, 60) for u in urls], now=now, queue_ttl_s=600,
                       rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
        lease = frontier.claim(source.name, len(urls), now=now, lease_s=60)
        frontier.ack(lease, [Completed(u, now + 3600, now) for u in urls], now=now)


def _before_the_run(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `collector run` says on stderr before Prefect starts (the flow is not started)."""
    from flows.cli.running import _checked_before_the_flow

    loaded = _checked_before_the_flow(str(path), argparse.Namespace(role="run"))
    assert not isinstance(loaded, tuple)  # the run would go ahead: a warning, not a refusal
    return capsys.readouterr().err


def test_a_deleted_sink_folder_beside_done_pages_is_said_by_status_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The folder deleted to "start again": the next run found every page fresh, fetched
    nothing, said "a no-op run" and left the sink empty; status showed 0 records, no more."""
    urls = [f"http://127.0.0.1:9/items/{i}.json" for i in range(3)]
    path = write_source(tmp_path, seeds={"urls": urls})
    _done_pages(path, *urls)
    (tmp_path / "out").mkdir()
    assert main(["status", str(path)]) == 0
    assert "note:" not in capsys.readouterr().out  # the folder is there: nothing to say
    shutil.rmtree(tmp_path / "out")
    gone = (
        f"sink folder {tmp_path / 'out'} does not exist, yet 3 pages are done in the frontier: "
        "their records went with it (deleted or moved? sink.path changed?), and runs fetch those"
        " pages again only as they go stale"
    )
    assert _status_note(path, capsys) == gone
    assert main(["status", str(path), "--json"]) == 0
    assert '"notes": ["sink folder' in capsys.readouterr().out
    assert not (tmp_path / "out").exists()  # status only looks
    assert _before_the_run(path, capsys) == f"{path}: warning: {gone}\n"


def _status_note(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """The note `collector status` ends with (exit 0), without its `  note: ` lead."""
    assert main(["status", str(path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("  note: "), last
    return last.removeprefix("  note: ")


def test_a_renamed_source_is_said_before_it_fetches_everything_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Renamed between runs, a source starts with an empty frontier under its new name and
    wrote every record a second time into new files beside the old ones."""
    urls = [f"http://127.0.0.1:9/items/{i}.json" for i in range(2)]
    path = write_source(tmp_path, name="shop", seeds={"urls": urls})
    _done_pages(path, *urls)
    with JsonlSink(tmp_path / "out", source="shop") as sink:  # the records of that run
        sink.write([SinkRecord(str(i), {"id": i}, u) for i, u in enumerate(urls)], token=1,
                   batch_id="r:1")  # fmt: skip
    assert _before_the_run(path, capsys) == ""  # its own records, its own frontier
    path.write_text(path.read_text("utf-8").replace("name: shop", "name: shop2"), "utf-8")
    renamed = (
        f"{tmp_path / 'out'} holds records of shop but none of shop2, whose frontier is empty: "
        "if the source was renamed, its items, dead letters and records stay under the old name,"
        " and a run fetches every page again into shop2-*.jsonl beside them"
    )
    assert _status_note(path, capsys) == renamed
    assert _before_the_run(path, capsys) == f"{path}: warning: {renamed}\n"
    # Not renamed, only beside another source whose file still names it (init gives every
    # source `out`): no warning on a new source's first run.
    (tmp_path / "shop.yaml").write_text("name: shop\n", encoding="utf-8")
    assert _before_the_run(path, capsys) == ""


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (  # a latin-1 page: orjson said "surrogates not allowed: line 1 column 1 (char 0)"
            b'{"id": 7, "name": "caf\xe9"}',
            "invalid JSON: the body is not UTF-8 (byte 0xe9 at offset 22); JSON is UTF-8: a page"
            " in another charset must declare it (Content-Type: ...; charset=) or needs a"
            " record.parser that decodes it",
        ),
        (b'{"id": 7,', "invalid JSON: unexpected end of data: line 1 column 10 (char 9)"),
        (  # markup first: it is not JSON in any charset
            b"<html>caf\xe9</html>",
            "invalid JSON (the body starts with '<': an HTML or XML page, not JSON): str is not"
            " valid UTF-8: surrogates not allowed: line 1 column 1 (char 0)",
        ),
    ],
)
def test_a_page_that_is_not_utf8_names_the_byte_and_where(body: bytes, said: str) -> None:
    with pytest.raises(PermanentFetchError) as info:
        RecordParser().parse("http://127.0.0.1/x", body)
    assert str(info.value) == said


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (  # "record 2" was read as the second, an object: the third is the list
            b'[{"id": 1, "a": 1}, {"id": 2, "b": "x"}, [1, 2], "s"]',
            "record 2 (counted from 0) of 4 is a list, not an object",
        ),
        (b"null", "the document is null, not an object"),  # not "record 0"
    ],
)
def test_a_record_that_is_not_an_object_is_placed_without_doubt(body: bytes, said: str) -> None:
    with pytest.raises(PermanentFetchError) as info:
        RecordParser().parse("http://127.0.0.1/x", body)
    assert str(info.value) == said


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [
        ("run", "--drain-wait", "-1"),  # was Prefect's ParameterTypeError traceback, exit 1
        ("run", "--lock-wait", "nan"),
        ("run", "--metrics-hold", "-5"),
        ("work", "--idle-wait", "-1"),
    ],
)
def test_a_negative_wait_is_refused_by_the_usage_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, option: str, value: str
) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/a"]})
    with pytest.raises(SystemExit) as info:
        main([command, str(path), option, value])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"collector {command}: error: argument {option}: must be 0 seconds or more, not {value}"
    )


def test_a_block_that_does_not_exist_says_where_it_looked_and_what_is_there(
    prefect_api: str,
) -> None:
    """`block:NAME` misspelt said only Prefect's "Unable to find block document named X for
    block type collector-source": not which server was asked, nor what is saved there."""
    from blocks.source import CollectorSource
    from collector.config import SourceError
    from flows.sources import resolve_source

    definition = {
        "name": "shop-items",
        "seeds": {"urls": ["http://127.0.0.1:9/items/1.json"]},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "allow_private_networks": True,
    }
    CollectorSource(definition=definition).save("shop-items", overwrite=True)
    with pytest.raises(SourceError) as missing:
        resolve_source("block:shop-itens")
    assert missing.value.problems == [
        f"block 'shop-itens': no CollectorSource block of that name on {prefect_api}: did you"
        " mean block:shop-items? (`collector blocks save shop-itens SOURCE.yaml` saves one)"
    ]


def test_a_correction_that_changes_the_records_key_is_refused(
    prefect_api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Correcting a record's missing field, a reviewer typed another id: it was stored under
    that key (a record the page never had), and the page's own record stayed missing."""
    url = "http://127.0.0.1:9/items/12.json"
    path = write_source(tmp_path, seeds={"urls": [url]})
    source = load_source(path)
    now = time.time()
    with SqliteFrontier(source.frontier_path) as frontier:  # the page dead, as a run leaves it
        frontier.offer(source.name, [Offer(url, 60)], now=now, queue_ttl_s=600,
                       rank_for=lambda *a: 1.0, run_id="r")  # fmt: skip
        lease = frontier.claim(source.name, 1, now=now, lease_s=60)
        frontier.ack(lease, [DeadLettered(url, 1, "validation")], now=now)
    failed = DeadLetter(source=source.name, url=url, stage="validate", error_class="schema",
                        message="a: key missing", attempts=1, first_seen=now, last_seen=now,
                        record_key="12", payload={"id": 12, "name": "y"})  # fmt: skip
    with open_deadletters(source) as store:
        store.put([failed])
        assert store.escalate(failed.id, "still fails after repair")
    retyped = '{"id": 99, "a": 0, "name": "y"}'
    assert main(["review", str(path), "--id", failed.id, "--accept", retyped]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "refused, put back: the corrected record's key is '99', not the entry's '12' (at 'id'):"
        " a correction keeps its record's key; fix it back, or discard this entry"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.jsonl"))
    fixed = '{"id": 12, "a": 0, "name": "y"}'
    assert main(["review", str(path), "--id", failed.id, "--accept", fixed]) == 0
    assert [r["id"] for r in sink_lines(tmp_path / "out")] == [12]


def test_review_takes_a_block_as_every_command_does_and_a_list_makes_nothing(
    prefect_api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collector review block:NAME` said "block:NAME: file not found" (it read only files),
    and `review --list` of a source never run made its dead-letter store to say "0"."""
    from blocks.source import CollectorSource

    definition = {
        "name": "reviewed",
        "seeds": {"urls": ["http://127.0.0.1:9/items/1.json"]},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "allow_private_networks": True,
    }
    CollectorSource(definition=definition, base_dir=str(tmp_path)).save("reviewed", overwrite=True)
    assert main(["review", "block:reviewed", "--list"]) == 0
    assert capsys.readouterr().out == "0 in review in reviewed\n"
    assert list(tmp_path.iterdir()) == []  # only looked: no .collector/, no out/


def test_deploy_dir_over_the_folder_init_wrote_skips_its_companion_files(tmp_path: Path) -> None:
    """`collector deploy --dir .` where `collector init` wrote shop.yaml refused the folder:
    shop.deployment.yaml and shop.suite.json were read as sources ("name: required key")."""
    from flows.cli.deploy import references

    for name in ("shop.yaml", "shop.suite.json", "shop.deployment.yaml", "other.json"):
        (tmp_path / name).write_text("{}", encoding="utf-8")
    found = references(argparse.Namespace(sources=[], dir=str(tmp_path)))
    assert found == [str(tmp_path / "other.json"), str(tmp_path / "shop.yaml")]


def test_a_helper_on_a_source_never_planned_says_why_it_claimed_nothing(
    prefect_api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collector work` on a source never run ended "claimed 0 = ... balanced", exit 0: read
    as a source with nothing to do, by a user who expected the helper to collect it."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/items/1.json"]})
    assert main(["work", str(path), "--idle-wait", "0"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == (
        "nothing claimed: no item of test-items was queued within --idle-wait; a worker only "
        "helps drain what `collector run` planned (it never plans the seeds)"
    )
