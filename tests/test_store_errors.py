"""Stores and the commands that open them: a command that only reads makes no store, and a store
that cannot open is said before anything else starts, in one line naming the file and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.cli import EXIT_OK, main
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
