"""The progress display and the summary tell the truth about a run of 304s, at 80 columns:
the bar moves per item (a 304 is an item that ended), the account under it names every term
that is not zero (``not_modified`` too), pages answered 304 count in pages/s, and no line is
wider than the terminal (the terminal would cut a word in two)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import sys
import time
from pathlib import Path
from typing import Any

from collector.run.summary import RunSummary
from flows.cli._progress import Progress, account_words, wrapped
from tests.change_site import ChangeSite
from tests.helpers import summary_of, write_source
from tests.test_cli_terminal import COLLECTOR, ROOT, env

PAGES = 20


def _source(tmp_path: Path, site: ChangeSite) -> Path:
    names = [f"p{i}" for i in range(PAGES)]
    for i, name in enumerate(names):
        site.set(name, json.dumps({"id": i}).encode(), "strong")
    # stale at once: the next run asks again with the validators, and every page answers 304
    return write_source(
        tmp_path, seeds={"urls": [site.url(n) for n in names]}, ttl={"default_fresh_s": 0}
    )


def _on_a_terminal(args: list[str], api: str, columns: int = 80) -> tuple[int, str]:
    """The command on a pseudo-terminal ``columns`` wide: (exit code, what the screen got)."""
    import fcntl
    import pty
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on a terminal of that width
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
        os.chdir(ROOT)
        os.execve(sys.executable, [*COLLECTOR, *args], env(api, COLUMNS=None))
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 120)
        if not ready:
            break
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode("utf-8", "replace"))
    return os.waitstatus_to_exitcode(status), text


def test_a_run_of_304s_at_80_columns_says_what_it_did(tmp_path: Path, prefect_api: str) -> None:
    from flows.collect import collect

    with ChangeSite() as site:
        path = _source(tmp_path, site)
        first = summary_of(asyncio.run(collect(source=str(path))))  # setup: in this process
        assert first["stored"] == PAGES, first
        code, screen = _on_a_terminal(["run", str(path)], prefect_api)
    assert code == 0, screen[-3000:]
    lines = [line for line in re.split(r"[\r\n]", screen) if line.strip()]
    wide = [line for line in lines if len(line) > 80]
    assert not wide, wide  # none cut by the terminal mid-word
    bars = [line for line in lines if "collected" in line and f"/{PAGES}" in line]
    assert bars and f"{PAGES}/{PAGES}" in bars[-1], screen[-3000:]
    under = lines[lines.index(bars[-1]) + 1]
    assert f"not_modified {PAGES}" in under, under  # the bar's account names the 304s
    said = re.search(r"([\d.]+)\s+pages/s", " ".join(lines))  # wrapped between words
    assert said is not None and float(said.group(1)) > 0, screen[-2000:]  # 304s are answers


def test_the_bar_counts_each_304_as_its_fetch_ends(tmp_path: Path, prefect_api: str) -> None:
    """The bar's counter, read when a batch settles: every page of the batch is in it already
    (a 304 too), so the bar did not wait for the batch to move."""
    from flows.collect import run_collect

    with ChangeSite() as site:
        path = _source(tmp_path, site)
        assert run_collect(str(path), batch_size=PAGES, max_items=None, drain_wait_s=5).stored
        time.sleep(0.01)  # default_fresh_s 0: due as soon as the clock moves on
        progress = Progress(enabled=False)
        seen: list[int] = []

        def listener(event: str, data: dict[str, Any]) -> None:
            if event == "batch":
                seen.append(progress.ended)
            progress(event, data)

        summary = run_collect(str(path), batch_size=PAGES, max_items=None, drain_wait_s=5,
                              listeners=[listener])  # fmt: skip
    assert summary.not_modified == PAGES, summary
    assert seen == [PAGES]
    assert summary.pages_per_second > 0


def test_every_term_that_is_not_zero_is_shown_and_fits() -> None:
    summary = RunSummary(source="s", run_id="r", discovered=397, not_modified=199, stored=150,
                         dead_lettered=40, already_dead=2, retried=8, deferred_by_circuit=3,
                         fresh_uncounted=18, expired=1, queued=5)  # fmt: skip
    running = account_words(summary)
    assert running == ["stored 150", "not_modified 199", "dead_lettered 40", "already_dead 2",
                       "retried 8", "deferred_by_circuit 3", "fresh_uncounted 18"]  # fmt: skip
    assert "queued 5" in account_words(summary, at_end=True)  # known once the run closed
    lines = wrapped(["discovered 397", *running], 40)
    assert all(len(line) <= 40 for line in lines) and len(lines) > 1, lines
    assert " ".join(lines).split() == " ".join(["discovered 397", *running]).split()
