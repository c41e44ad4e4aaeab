"""A User-Agent header written with ``${env:NAME}``: what the source says it sends is what the
site receives and what its robots.txt is matched against, and ``validate`` judges that value.

``Source.user_agent`` once returned the header as written (``${env:UA}``), a name no site sees:
the check of a contact skipped it, whatever the variable held.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import load_source, source_warnings
from collector.fetch.engine import FetchEngine
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget
from tests.helpers import write_source
from tests.robots_site import RobotsSite

AGENT = "acme-prices/1.0 (+https://acme.example/bot; ops@acme.example)"
HEADER = {"User-Agent": "${env:COLLECTOR_TEST_UA}"}
PUBLIC = "https://api.shop-collector-ua.io/v1/items/{i}.json"  # never fetched: validate only


async def test_the_site_gets_the_resolved_agent_and_its_robots_rule_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLLECTOR_TEST_UA", AGENT)
    with RobotsSite() as site:
        site.robots = (200, "User-agent: acme-prices\nDisallow: /p/secret\n\nUser-agent: *\n")
        source = load_source(
            write_source(
                tmp_path,
                seeds={"urls": [site.url("/p/1")]},
                limits={"headers": HEADER},
                politeness={"robots": "obey"},
            )
        )
        items = [ClaimedItem(site.url(p), 0, None, 0.0) for p in ("/p/1", "/p/secret")]
        async with FetchEngine.for_source(source) as engine:
            results = await engine.fetch_batch(items, budget=RetryBudget(ratio=1.0, min_retries=10))
        received = {agent for _, _, agent, _ in site.log}
        asked = site.paths()
    assert received == {AGENT}, received  # robots.txt and the page alike
    assert source.user_agent == AGENT  # what the source says it sends is what was received
    assert [r.status for r in results] == ["ok", "failed"], results
    refused = results[1].error
    assert refused is not None and refused.error_class == "robots", refused
    assert repr(AGENT) in str(refused)  # the rule matched the agent sent, named as sent
    assert "/p/secret" not in asked, asked


def test_validate_judges_the_agent_the_variable_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def warned() -> list[str]:
        path = write_source(
            tmp_path, seeds={"template": PUBLIC, "range": [0, 3]}, limits={"headers": HEADER}
        )
        return source_warnings(load_source(path))

    monkeypatch.setenv("COLLECTOR_TEST_UA", "acme-prices/1.0")  # no one to contact
    (line,) = [w for w in warned() if "User-Agent" in w]
    assert line.startswith(
        "the User-Agent '${env:COLLECTOR_TEST_UA}' ('acme-prices/1.0' here) sent to "
        "api.shop-collector-ua.io names no contact"
    ), line

    monkeypatch.setenv("COLLECTOR_TEST_UA", AGENT)
    assert [w for w in warned() if "User-Agent" in w] == []

    monkeypatch.delenv("COLLECTOR_TEST_UA")  # unset here: said once, as an unset variable
    found = warned()
    assert [w for w in found if "User-Agent" in w and "COLLECTOR_TEST_UA is not set" not in w] == []
    assert any("COLLECTOR_TEST_UA is not set" in w for w in found), found


def test_a_secret_agent_is_not_loaded_by_a_check(tmp_path: Path) -> None:
    """A ``${secret:...}`` User-Agent is loaded at a run's start only: a check that asked
    Prefect for the block would fail (or hang) with no server, so it is left unjudged."""
    path = write_source(
        tmp_path,
        seeds={"template": PUBLIC, "range": [0, 3]},
        limits={"headers": {"User-Agent": "${secret:no-such-block}"}},
    )
    assert [w for w in source_warnings(load_source(path)) if "User-Agent" in w] == []
