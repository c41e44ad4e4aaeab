"""Mistakes a new user makes, found by trying Collector from outside: each gets one line that
says what is wrong and where, never a traceback, and never a silent surprise."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import SourceError, load_source, source_warnings
from collector.errors import BackendError
from collector.run.summary import RunSummary
from flows.cli import EXIT_OK, main
from tests.helpers import write_source


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    """PyYAML keeps the last of two equal keys: a second `ttl:` section or a repeated setting
    would undo the first without a word."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]})
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("  lease_s: 60\n", "  lease_s: 60\n  lease_s: 90\n"), "utf-8")
    line = text.splitlines().index("  lease_s: 60") + 1
    with pytest.raises(SourceError) as info:
        load_source(path)
    assert info.value.problems == [
        f"{path}: invalid YAML: line {line + 1}, column 3: key 'lease_s' is given twice (first "
        f"on line {line}); YAML would keep only the last: remove one, or merge them"
    ]


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    """`<<: *base` then a key of its own is the YAML way to override, not a repeated key."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]})
    text = path.read_text(encoding="utf-8").replace("ttl:\n", "ttl: &ttl\n")
    path.write_text(text + "x-spare: {<<: *ttl, lease_s: 90}\n", "utf-8")
    with pytest.raises(SourceError) as info:  # only the unknown key, no "given twice"
        load_source(path)
    assert [p.split(": ", 2)[1] for p in info.value.problems] == ["x-spare"]


def test_a_variable_in_user_agent_is_refused_not_sent_as_written(tmp_path: Path) -> None:
    """politeness.user_agent is not resolved: `${env:UA}` would reach every host literally."""
    path = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1/a"]},
        politeness={"user_agent": "acme/1.0 ${env:ACME_CONTACT}"},
    )
    with pytest.raises(SourceError) as info:
        load_source(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: politeness.user_agent: 'acme/1.0 ${{env:ACME_CONTACT}}'")
    assert "not resolved" in problem and "limits.headers" in problem


@pytest.mark.parametrize("command", [["status"], ["batches"]])
def test_a_sink_folder_not_made_yet_is_read_as_empty_and_not_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """Commands that only look leave nothing behind: no sink folder (nor store files)."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, sink={"path": "out"})
    assert main([*command, str(path)]) == EXIT_OK, capsys.readouterr()
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_sink_folder_that_cannot_be_made_is_one_line_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the sink is written (a run, a retry), the folder it cannot make is one line."""
    from collector.backends import open_sink

    (tmp_path / "blocker").write_text("a file where the sink's folder should be\n", "utf-8")
    path = write_source(
        tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, sink={"path": "blocker/out"}
    )
    with pytest.raises(BackendError) as info:
        open_sink(load_source(path))
    message = str(info.value)
    assert message.startswith(f"sink {tmp_path / 'blocker' / 'out'}: cannot create folder")
    assert len(message.splitlines()) == 1, message
    # a reader finds nothing there, and says so without failing
    assert main(["status", str(path)]) == EXIT_OK, capsys.readouterr()


def test_a_run_stopped_before_its_first_fetch_does_not_call_itself_a_no_op(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ctrl-C while the run planned: exit 130, and the summary must not say "not a failure"."""
    from flows.cli.running import _print_summary

    stopped = RunSummary(
        source="s", run_id="r", discovered=300, queued=300, balanced=True, interrupted="SIGINT"
    )
    _print_summary(stopped)
    out = capsys.readouterr().out
    assert "nothing fetched: 300 left queued (stopped by SIGINT first: run again to continue)" in (
        out
    ), out
    assert "no-op" not in out

    _print_summary(RunSummary(source="s", run_id="r", discovered=3, queued=3, balanced=True))
    assert "nothing fetched: 3 left queued (a no-op run, not a failure)" in capsys.readouterr().out


def test_a_queue_ttl_shorter_than_the_rate_needs_is_warned_about(tmp_path: Path) -> None:
    """queue_ttl_s: 1 with 100 pages at 5 a second: every page expired before its claim, each
    run planned them again, and every run balanced and exited 0 with nothing fetched."""
    urls = [f"http://127.0.0.1/items/{i}" for i in range(100)] + ["http://127.0.0.2/a"]
    for queue_ttl_s, warned in ((1, True), (19, True), (20, False)):
        path = write_source(
            tmp_path,
            seeds={"urls": urls},
            ttl={"queue_ttl_s": queue_ttl_s},
            limits={"per_domain_rate": "5/second"},
        )
        found = [w for w in source_warnings(load_source(path)) if "queue_ttl_s" in w]
        assert bool(found) is warned, (queue_ttl_s, found)
    path = write_source(
        tmp_path,
        seeds={"urls": urls},
        ttl={"queue_ttl_s": 1},
        limits={"per_domain_rate": "5/second"},
    )
    assert [w for w in source_warnings(load_source(path)) if "queue_ttl_s" in w] == [
        "ttl.queue_ttl_s (1 s) is shorter than the 20 s that 100 seed URLs of 127.0.0.1 take at "
        "limits.per_domain_rate '5/second': pages queued longer expire unfetched, and each run "
        "plans them again; raise queue_ttl_s or the rate"
    ]


def test_a_variable_where_none_is_resolved_is_refused_with_its_key(tmp_path: Path) -> None:
    """`sink.path: ${env:OUT_DIR}` made a folder named `${env:OUT_DIR}`; the fields that do
    resolve variables (headers, dsn, Redis URLs) are left alone."""
    path = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1/a"]},
        sink={"path": "${env:OUT_DIR}"},
        state_dir="state-${secret:where}",
        limits={"headers": {"Authorization": "Bearer ${env:TOKEN}"}},
    )
    with pytest.raises(SourceError) as info:
        load_source(path)
    assert [p.split(": ", 2)[1:] for p in info.value.problems] == [
        [key, f"{ref} is not resolved here and would be used as written (${{env:}} and "
         "${secret:} work only in limits.headers, limits.rate_storage, frontier.url, "
         "deadletters.url and sink.dsn)"]
        for key, ref in (("sink.path", "${env:OUT_DIR}"), ("state_dir", "${secret:where}"))
    ]  # fmt: skip


def test_the_ctrl_c_line_counts_the_items_never_claimed_too() -> None:
    """300 pages, Ctrl-C after 45 stored and 155 claimed but not fetched: the other 100 were
    never claimed. "45 stored, 155 returned" alone read as 100 items lost."""
    stopped = RunSummary(
        source="s", run_id="r", discovered=300, stored=45, queued=255, returned=155,
        balanced=True, interrupted="SIGINT",
    )  # fmt: skip
    assert stopped.interruption == (
        "interrupted by SIGINT: 45 stored, 155 returned to the queue unchanged (255 queued in "
        "all), lock released; run again to continue"
    )
    every = stopped.with_(stored=0, queued=300, returned=300)
    assert "300 returned to the queue unchanged, lock released" in every.interruption


def test_a_folder_given_as_the_source_is_said_plainly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"{tmp_path}: is a folder; give the source's .yaml file in it\n"
    )  # not "cannot read: [Errno 21] Is a directory"
