"""Collector's Prefect blocks on a real Prefect API: saved, loaded, and run by name."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from blocks import CollectorBackends, CollectorSource, block_name_of, register_block_types
from collector.config import SourceError
from flows.cli import main
from flows.sources import resolve_source


def _document(name: str = "blocky") -> dict[str, Any]:
    return {
        "name": name,
        "seeds": {"urls": ["http://127.0.0.1:9/items/1.json"]},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
        "allow_private_networks": True,
    }


@pytest.mark.parametrize(
    ("parameter", "name"),
    [
        ("block:shop-items", "shop-items"),
        ("collector-source/shop-items", "shop-items"),
        ("sources/items.yaml", None),
        ("/abs/block:x.yaml", None),
        ("block:", None),
    ],
)
def test_block_name_of(parameter: str, name: str | None) -> None:
    assert block_name_of(parameter) == name


def test_source_from_block_is_checked_like_a_file_with_backends_applied(
    prefect_api: str, tmp_path: Path
) -> None:
    register_block_types()
    backends = CollectorBackends(
        frontier_redis_url="redis://:hunter2@127.0.0.1:1/0", sink_path="/data/records"
    )
    CollectorSource(definition=_document(), base_dir=str(tmp_path), backends=backends).save(
        "blocky", overwrite=True
    )
    for parameter in ("block:blocky", "collector-source/blocky"):
        source = resolve_source(parameter)
        assert source.name == "blocky"
        assert source.base_dir == tmp_path.resolve()
        assert source.state_path == tmp_path.resolve() / ".collector"
        assert source.sink_path == Path("/data/records")
        assert (source.frontier.type, source.frontier.url) == (
            "redis", "redis://:hunter2@127.0.0.1:1/0"
        )  # fmt: skip
        assert source.deadletters.type == "sqlite"  # not overridden: the definition's own


def test_block_secrets_are_masked_on_the_server(prefect_api: str) -> None:
    from prefect.client.orchestration import get_client

    CollectorBackends(deadletters_redis_url="redis://:hunter2@127.0.0.1:1/0").save(
        "masked", overwrite=True
    )
    with get_client(sync_client=True) as client:
        document = client.read_block_document_by_name(
            "masked", "collector-backends", include_secrets=False
        )
    assert "hunter2" not in str(document.data)
    backends = CollectorBackends.load("masked")
    assert isinstance(backends, CollectorBackends)  # load is sync here (no event loop)
    assert backends.source_overrides()["deadletters"]["url"] == "redis://:hunter2@127.0.0.1:1/0"


def test_bad_block_or_definition_is_one_line_naming_it(prefect_api: str) -> None:
    with pytest.raises(SourceError) as missing:
        resolve_source("block:no-such-block")
    assert missing.value.problems[0].startswith("block 'no-such-block': ")

    broken = _document("broken")
    broken["ttl"] = {"http_timeout_s": -1}
    CollectorSource(definition=broken).save("broken", overwrite=True)
    with pytest.raises(SourceError) as invalid:
        resolve_source("block:broken")
    assert any(p.startswith("block broken: ttl.http_timeout_s") for p in invalid.value.problems)

    with pytest.raises(ValueError, match="definition: needs a `name`"):
        CollectorSource(definition={"seeds": {}})
    with pytest.raises(ValueError, match="frontier_redis_url: must be a redis://"):
        CollectorBackends(frontier_redis_url="http://example.org")


def test_cli_registers_types_and_saves_a_source_file_as_a_block(
    prefect_api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["blocks", "register"]) == 0
    assert "collector-source" in capsys.readouterr().out
    path = tmp_path / "items.yaml"
    path.write_text(yaml.safe_dump(_document("from-file")), encoding="utf-8")
    assert main(["blocks", "save", "from-file", str(path)]) == 0
    assert "source=block:from-file" in capsys.readouterr().out
    loaded = resolve_source("block:from-file")
    assert loaded.name == "from-file"
    assert loaded.sink_path == tmp_path.resolve() / "out"  # relative to the file's folder

    path.write_text("name: x\nseeds: {}\n", encoding="utf-8")
    assert main(["blocks", "save", "bad", str(path)]) == 2
    assert str(path) in capsys.readouterr().err


async def test_every_flow_takes_a_block_source(prefect_api: str, tmp_path: Path) -> None:
    """Triage and the backlog monitor resolve `block:<name>` like collect does (the deployed
    triage is started with the collect run's source reference, which may be a block)."""
    from flows.backlog import backlog_monitor
    from flows.triage import triage

    path = tmp_path / "items.yaml"
    path.write_text(yaml.safe_dump(_document("flow-block")), encoding="utf-8")
    assert main(["blocks", "save", "flow-block", str(path)]) == 0

    report = await triage(source="block:flow-block", dry_run=True)
    assert report["source"] == "flow-block"
    [sample] = await asyncio.to_thread(backlog_monitor, sources=["block:flow-block"])
    assert sample["source"] == "flow-block"
