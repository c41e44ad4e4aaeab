"""A GX suite given inline in the source (so a CollectorSource block carries it, editable in the
Prefect UI) is checked at load like a file and validates a real run like a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from blocks.source import CollectorSource
from collector.config import SourceError, load_source
from collector.demo.scenario import SUITE
from collector.demo.site import FaultSite
from flows.collect import collect
from tests.helpers import summary_of, write_source

SEEDS = {"urls": ["http://127.0.0.1:9/items/1.json"]}


def test_an_inline_suite_is_checked_at_load_without_writing_the_state_folder(
    tmp_path: Path,
) -> None:
    good = load_source(write_source(tmp_path, seeds=SEEDS, validation={"suite": SUITE}))
    assert not (tmp_path / ".collector").exists()  # `collector validate` writes nothing
    broken = write_source(tmp_path, seeds=SEEDS, validation={"suite": {"expectations": 3}})
    with pytest.raises(SourceError, match=r"validation\.suite: .*expectations"):
        load_source(broken)
    path = good.suite_path
    assert path == tmp_path / ".collector" / "suites" / "test-items.json"
    assert path is not None and path.exists()
    written = path.stat().st_mtime_ns
    assert good.suite_path == path and path.stat().st_mtime_ns == written  # unchanged: kept


@pytest.mark.usefixtures("prefect_api")
async def test_a_block_source_validates_with_its_inline_suite(
    tmp_path: Path, site: FaultSite
) -> None:
    definition = {
        "name": "inline-suite",
        "seeds": {"urls": [site.url("/items/1.json"), site.url("/items/2.json?invalid=1")]},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "allow_private_networks": True,
        "validation": {"suite": SUITE},
    }
    await CollectorSource(definition=definition, base_dir=str(tmp_path)).save(
        "inline-suite", overwrite=True
    )
    summary = summary_of(await collect(source="block:inline-suite"))
    assert summary["balanced"]
    assert summary["stored"] == 1 and summary["dead_lettered"] == 1
    assert summary["deadletter_reasons"] == {"validate/schema": 1}
