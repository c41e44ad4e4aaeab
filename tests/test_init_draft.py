"""``collector init --from-url`` reads the example page as a run would (URL policy, robots.txt,
User-Agent, one attempt) and drafts the suite from its JSON: the columns present, their types,
the fields never null; it says what it guessed, the seeds' range included (from 0, the example
among them). The draft is checked with Great Expectations on the site's other pages."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.demo.site import FaultSite
from collector.settle.validation import SuiteValidator
from flows.cli._draft import draft_suite
from tests.test_cli_terminal import collector

FIELDS = ["id", "name", "price", "category", "updated"]


def _init(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    return collector("init", "shop", "--dir", str(tmp_path), "--from-url", url)


@pytest.mark.slow  # a `collector init` subprocess
def test_the_suite_is_drafted_from_the_example_page(tmp_path: Path, site: FaultSite) -> None:
    done = _init(tmp_path, site.url("/items/17.json"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"example {site.url('/items/17.json')}: HTTP 200, 1 record" in out, out
    assert f"columns: {', '.join(FIELDS)}" in out, out
    assert "types: id number, name str, price number, category str, updated str" in out, out
    assert "never null: id, name, price, category, updated" in out, out
    assert "seeds: {i} over range [0, 100) (the example is 17)" in out, out
    source = yaml.safe_load((tmp_path / "shop.yaml").read_text())
    assert source["seeds"]["range"] == [0, 100]
    suite = json.loads((tmp_path / "shop.suite.json").read_text())
    kinds = {(e["type"], e["kwargs"]["column"]) for e in suite["expectations"]}
    for column in FIELDS:
        assert ("expect_column_to_exist", column) in kinds
        assert ("expect_column_values_to_not_be_null", column) in kinds
    assert ("expect_column_values_to_be_of_type", "name") in kinds
    # the draft holds for the site's other pages (GX itself), and catches a broken one
    good = [json.loads(_get(site, f"/items/{i}.json")) for i in range(40)]
    broken = json.loads(_get(site, "/items/5.json?invalid=1"))
    result = SuiteValidator(tmp_path / "shop.suite.json").validate([*good, broken])
    assert len(result.good) == 40 and len(result.bad) == 1, result.bad


def _get(site: FaultSite, path: str) -> str:
    import httpx

    return httpx.get(site.url(path)).text


@pytest.mark.slow  # a `collector init` subprocess
def test_a_redirect_off_the_allowed_host_is_refused_and_said(
    tmp_path: Path, site: FaultSite
) -> None:
    """The example is fetched under the source's URL policy: its one allowed host, every
    redirect hop checked; the starter suite stays and init says why."""
    elsewhere = site.url("/items/3.json").replace("127.0.0.1", "localhost")
    done = _init(tmp_path, site.url(f"/items/3.json?redirect={elsewhere}"))
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("example "))
    assert "could not fetch it" in line and "localhost" in line, line
    assert "shop.suite.json is the starter" in line, line
    suite = json.loads((tmp_path / "shop.suite.json").read_text())
    assert [e["type"] for e in suite["expectations"]] == ["expect_column_values_to_not_be_null"]
    assert "/items/3.json" not in [r.path for r in site.requests], "followed the redirect"


@pytest.mark.slow  # a `collector init` subprocess
def test_a_page_that_does_not_answer_keeps_the_starter(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _init(tmp_path, f"http://127.0.0.1:{port}/items/3.json")
    assert done.returncode == 0, done.stderr
    assert f"cannot connect to 127.0.0.1:{port}" in done.stdout, done.stdout


@pytest.mark.slow  # a `collector init` subprocess
def test_a_listing_page_is_named_for_records_path(tmp_path: Path, site: FaultSite) -> None:
    done = _init(tmp_path, site.url("/items?start=0&count=3"))
    assert done.returncode == 0, done.stderr
    assert "its 'items' holds a list of records: set record.records_path: items" in done.stdout


def test_the_draft_from_json_types() -> None:
    record: dict[str, Any] = {"id": 1, "ok": True, "tags": ["a"], "meta": {}, "gone": None}
    draft = draft_suite([record], "sku")
    types = {e["kwargs"]["column"]: e["kwargs"].get("type_", e["kwargs"].get("type_list"))
             for e in draft.expectations if "type" in e["type"]}  # fmt: skip
    assert types == {"id": ["int", "float"], "ok": "bool", "tags": "list", "meta": "dict"}
    not_null = [e["kwargs"]["column"] for e in draft.expectations if "null" in e["type"]]
    assert not_null == ["id", "ok", "tags", "meta"]  # "gone" was null in the example
    assert any("'sku' is not a field of the example" in line for line in draft.said)
