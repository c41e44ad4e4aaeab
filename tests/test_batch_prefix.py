"""``compensate --batch`` and ``audit --batch`` take a unique abbreviation of a batch id, as
``collector batches`` lists them after a real run (``<run uuid>:<token>``): resolved to the full
id before anything changes; an ambiguous one changes nothing and names its candidates."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.config import load_source
from collector.demo.site import FaultSite
from collector.errors import ConfigError
from collector.recovery.batch_ids import resolve_batch_id
from collector.run.ledger import LedgerBook
from flows.cli import main
from tests.helpers import sink_lines, summary_of, write_source

ALWAYS = {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}


async def _cli(*args: str) -> int:
    call: Callable[[], int] = lambda: main(list(args))  # noqa: E731
    return await asyncio.to_thread(call)  # a command runs its own event loop


@pytest.mark.usefixtures("prefect_api")
async def test_a_short_batch_id_names_the_batch_after_a_real_run(
    tmp_path: Path, site: FaultSite, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.collect import collect

    (tmp_path / "suite.json").write_text(json.dumps({"name": "s", "expectations": [ALWAYS]}))
    path = write_source(tmp_path, seeds={"urls": [site.url(f"/items/{i}.json") for i in range(5)]},
                        validation={"suite": "suite.json"})  # fmt: skip
    summary_of(await collect(source=str(path), batch_size=2))
    capsys.readouterr()
    assert await _cli("batches", str(path), "--json") == 0
    ids = [row["batch_id"] for row in json.loads(capsys.readouterr().out)]
    assert len(ids) == 3 and len({i.rpartition(":")[0] for i in ids}) == 1  # one run, 3 tokens
    run = ids[0].rpartition(":")[0]
    before = sink_lines(tmp_path / "out")
    ledger = load_source(path).ledger_path

    # The run's first 8 characters: every batch of it. Nothing changes; up to 3 named.
    for command in (["compensate", "--reason", "x"], ["audit", "--dry-run"]):
        assert await _cli(command[0], str(path), "--batch", run[:8], *command[1:]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"collector: batch id {run[:8]!r} is ambiguous in {tmp_path / 'out'}: 3 batches"
            f" match it ({', '.join(sorted(ids))}); give more characters\n"
        )
    assert sink_lines(tmp_path / "out") == before
    assert LedgerBook(ledger).compensations() == []

    # The run's prefix with the whole token, as a person copies it from the table.
    target, token = ids[1], ids[1].rpartition(":")[2]
    short = f"{run[:8]}:{token}"
    assert await _cli("audit", str(path), "--batch", short, "--dry-run", "--json") == 0
    audited = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert [b["batch_id"] for b in audited["batches"]] == [target]
    assert await _cli("compensate", str(path), "--batch", short, "--dry-run") == 0
    assert f"compensating batch {target} would remove" in capsys.readouterr().out
    assert sink_lines(tmp_path / "out") == before
    assert await _cli("compensate", str(path), "--batch", short, "--reason", "bad") == 0
    assert f"compensated batch {target}: " in capsys.readouterr().out
    (line,) = LedgerBook(ledger).compensations()
    assert line.batch_id == target  # the ledger holds the full id, never the abbreviation
    assert len(sink_lines(tmp_path / "out")) < len(before)
    # Compensated already: said under its full id; a prefix of nothing: not in the sink (1).
    assert await _cli("compensate", str(path), "--batch", short, "--reason", "again") == 1
    assert f"batch {target} was already compensated (" in capsys.readouterr().err
    assert await _cli("compensate", str(path), "--batch", "ffff0000:1", "--reason", "x") == 1
    assert "batch ffff0000:1: not in" in capsys.readouterr().err


_RUN = st.text("0123456789abcdef-", min_size=4, max_size=12)


@given(st.lists(st.tuples(_RUN, st.integers(1, 30)), min_size=1, max_size=8, unique=True),
       st.data())  # fmt: skip
def test_resolution_is_the_plain_reading_of_an_abbreviation(
    batches: list[tuple[str, int]], data: st.DataObject
) -> None:
    """Against the plain reading: the ids the reference starts, or whose run it starts with
    the same token; exactly one is the answer, none leaves it as given, more is an error."""
    ids = [f"{run}:{token}" for run, token in batches]
    chosen = data.draw(st.sampled_from(ids))
    run, _, token = chosen.rpartition(":")
    cut = data.draw(st.integers(4, len(chosen)))
    reference = data.draw(st.sampled_from([chosen[:cut], f"{run[: max(1, cut - 4)]}:{token}"]))
    plain = sorted({
        i for i in ids
        if i.startswith(reference)
        or (i.rpartition(":")[2] == reference.rpartition(":")[2]
            and i.rpartition(":")[0].startswith(reference.rpartition(":")[0]))
    })  # fmt: skip
    if reference in ids or len(reference) < 4:
        assert resolve_batch_id(reference, ids, where="out") == reference
    elif len(plain) == 1:
        assert resolve_batch_id(reference, ids, where="out") == plain[0]
    else:
        assert plain, "the chosen id always matches"
        with pytest.raises(ConfigError, match=f"{len(plain)} batches match it"):
            resolve_batch_id(reference, ids, where="out")
