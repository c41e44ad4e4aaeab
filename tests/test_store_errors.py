"""Stores and the commands that open them: a command that only reads makes no store, and a store
that cannot open is said before anything else starts, in one line naming the file and field."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import EXIT_FAILED, EXIT_OK, main
from tests.helpers import write_source


def test_status_of_a_source_never_run_here_creates_no_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """status only reads: it says the source has not run here, and leaves no SQLite files."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]})
    state = tmp_path / ".collector"
    assert main(["status", str(path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"not run here yet (no {state / 'frontier.db'})" in out, out
    assert "queued 0  leased 0  done 0" in out and "dead letters: open 0" in out, out
    assert not state.exists(), sorted(p.name for p in state.iterdir())

    assert main(["status", str(path), "--json"]) == EXIT_OK
    (status,) = json.loads(capsys.readouterr().out)
    assert status["ran_here"] is False and status["items"]["total"] == 0
    assert not state.exists()


def test_status_after_the_stores_exist_reads_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once the stores exist (as a run leaves them), status reads them as before."""
    from collector.backends import open_backends
    from collector.config import load_source

    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]})
    with open_backends(load_source(path)):  # what run opens: the files are made
        pass
    assert main(["status", str(path), "--json"]) == EXIT_OK
    (status,) = json.loads(capsys.readouterr().out)
    assert status["ran_here"] is True
    assert main(["status", str(path)]) == EXIT_OK
    assert "0 items in" in capsys.readouterr().out


def _closed_port() -> int:
    """A local port nothing listens on (bound, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_retry_with_an_unreachable_frontier_says_so_before_any_prefect_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock lives on a Prefect server, which is started when none runs: a Redis frontier
    that does not answer must be said first, not after that start (and its wait)."""
    import flows.cli.recovery as recovery

    def no_server() -> None:  # a tripwire: reaching the lock's server is the bug
        raise AssertionError("a Prefect server was started before the frontier was opened")

    monkeypatch.setattr(recovery, "_prefect_server", no_server)
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    path = write_source(
        tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, frontier={"type": "redis", "url": url}
    )
    assert main(["deadletters", "retry", str(path), "--all"]) == EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith("collector: ") and "frontier" in err and "connect" in err, err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("command", [["status"], ["run"], ["deadletters", "retry"]])
def test_an_unreachable_redis_frontier_names_the_file_and_setting(
    tmp_path: Path, command: list[str]
) -> None:
    """`collector: <file>: frontier.url redis://...: cannot connect ...`, exit 1, one line,
    the password still scrubbed (run through the real command, as a user types it)."""
    url = f"redis://app:hunter2@127.0.0.1:{_closed_port()}/0"
    path = write_source(
        tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, frontier={"type": "redis", "url": url}
    )
    extra = ["--all"] if command[0] == "deadletters" else []
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", *command, str(path), *extra],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == EXIT_FAILED, done.stderr
    (line,) = done.stderr.strip().splitlines()
    scrubbed = url.replace("hunter2", "[redacted]")
    assert line.startswith(f"collector: {path}: frontier.url {scrubbed}: cannot connect: "), line
    assert "hunter2" not in done.stderr


def test_deadletters_list_of_a_source_never_run_here_creates_no_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """list only reads: an empty listing, and no .collector/ folder left behind."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]})
    assert main(["deadletters", "list", str(path)]) == EXIT_OK
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / ".collector").exists()


@pytest.mark.usefixtures("prefect_api")  # both commands run their flow
def test_dry_runs_of_triage_and_audit_on_a_source_never_run_here_make_no_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run only reads: after `triage --dry-run` and `audit --dry-run` on a source never
    run here there is no .collector/ and no sink folder, and status still says so."""
    (tmp_path / "suite.json").write_text(
        json.dumps({"name": "items", "expectations": [
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}]}),
        encoding="utf-8",
    )  # fmt: skip
    path = write_source(
        tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, validation={"suite": "suite.json"}
    )
    assert main(["triage", str(path), "--dry-run"]) == EXIT_OK
    assert main(["audit", str(path), "--dry-run"]) == EXIT_OK
    capsys.readouterr()
    assert not (tmp_path / ".collector").exists(), sorted((tmp_path / ".collector").iterdir())
    assert not (tmp_path / "out").exists()
    assert main(["status", str(path)]) == EXIT_OK
    assert "not run here yet" in capsys.readouterr().out


def test_look_only_commands_answer_while_the_suite_is_broken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A suite half-edited (invalid JSON) does not hide where the items are: status, batches and
    deadletters list answer with one note naming the problem; validate and a run still refuse."""
    (tmp_path / "suite.json").write_text('{"name": "shop", "expectations": [', encoding="utf-8")
    path = write_source(
        tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, validation={"suite": "suite.json"}
    )
    for command in (["status"], ["batches"], ["deadletters", "list"]):
        assert main([*command, str(path)]) == EXIT_OK, command
        err = capsys.readouterr().err
        notes = [line for line in err.splitlines() if line.startswith("note: ")]
        assert len(notes) == 1 and "suite" in notes[0], (command, err)
        assert f"collector validate {path}" in notes[0]
    assert main(["status", str(path), "--json"]) == EXIT_OK
    (status,) = json.loads(capsys.readouterr().out)  # stdout stays the JSON alone
    assert status["ran_here"] is False
    assert main(["validate", str(path)]) == 2
    assert "suite" in capsys.readouterr().err


def test_look_only_commands_still_refuse_a_source_whose_model_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only what a run alone uses is let through: a wrong key is still exit 2."""
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, colour="blue")
    assert main(["status", str(path)]) == 2
    assert "colour" in capsys.readouterr().err
