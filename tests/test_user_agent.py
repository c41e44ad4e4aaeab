"""The User-Agent names who asks and how to reach them: ``politeness.user_agent`` is sent to
every host (robots.txt included) and named in robots dead letters; ``validate`` warns while a
public host would get Collector's own, which names no one; ``init`` writes one from
``--contact``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from collector.config import SourceError, load_source, source_warnings
from collector.defaults import USER_AGENT
from tests.helpers import summary_of, write_source
from tests.robots_site import RobotsSite
from tests.test_cli_terminal import collector

AGENT = "acme-prices/1.0 (+https://acme.example/bot; ops@acme.example)"
PUBLIC = "https://api.shop-collector-ua.io/v1/items/{i}.json"  # never fetched: validate only


def _warned(tmp_path: Path, **politeness: str) -> list[str]:
    path = write_source(tmp_path, seeds={"template": PUBLIC, "range": [0, 3]},
                        politeness=politeness)  # fmt: skip
    return [w for w in source_warnings(load_source(path)) if "User-Agent" in w or "user_agent" in w]


def test_the_default_agent_is_named_while_a_public_host_would_get_it(tmp_path: Path) -> None:
    (warning,) = _warned(tmp_path)
    assert "politeness.user_agent is not set" in warning and "api.shop-collector-ua.io" in warning
    assert USER_AGENT in warning
    assert _warned(tmp_path, user_agent=AGENT) == []
    (nameless,) = _warned(tmp_path, user_agent="acme-prices/1.0")
    assert "names no contact" in nameless


def test_a_local_site_is_not_warned_about(tmp_path: Path) -> None:
    path = write_source(tmp_path, seeds={"template": "http://127.0.0.1:9/{i}", "range": [0, 3]})
    assert not [w for w in source_warnings(load_source(path)) if "user_agent" in w]


def test_an_agent_of_two_lines_is_refused(tmp_path: Path) -> None:
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/"]},
                        politeness={"user_agent": "acme\r\nX-Evil: 1"})  # fmt: skip
    with pytest.raises(SourceError, match=r"politeness\.user_agent"):
        load_source(path)


@pytest.mark.slow  # `collector` subprocesses
def test_validate_warns_and_init_writes_the_contact(tmp_path: Path) -> None:
    path = write_source(tmp_path, seeds={"template": PUBLIC, "range": [0, 3]})
    done = collector("validate", str(path), COLUMNS="300")
    assert done.returncode == 0, done.stderr
    assert "politeness.user_agent is not set" in done.stdout + done.stderr
    made = collector("init", "shop", "--dir", str(tmp_path / "new"), "--from-url",
                     PUBLIC.replace("{i}", "17"), "--contact", "ops@acme.example")  # fmt: skip
    assert made.returncode == 0, made.stderr
    source = load_source(tmp_path / "new" / "shop.yaml")
    assert source.politeness.user_agent == "shop/1.0 (ops@acme.example)"
    assert "user_agent" not in made.stdout + made.stderr  # no warning: it names a contact


def test_every_request_carries_the_agent_and_robots_names_it(
    tmp_path: Path, prefect_api: str
) -> None:
    from flows.collect import collect

    with RobotsSite() as site:
        site.robots = (200, "User-agent: acme-prices\nDisallow: /p/secret\n")
        path = write_source(
            tmp_path,
            seeds={"urls": [site.url("/p/1"), site.url("/p/secret")]},
            politeness={"user_agent": AGENT},
        )
        summary = summary_of(asyncio.run(collect(source=str(path))))  # the flow, in-process
        agents = {agent for _, _, agent, _ in site.log}
    assert agents == {AGENT}, agents  # robots.txt and the pages alike
    assert (summary["stored"], summary["dead_lettered"]) == (1, 1), summary
    listed = collector("deadletters", "list", str(path), "--json")
    (letter,) = json.loads(listed.stdout)
    assert AGENT in letter["message"] and "collector/0.1" not in letter["message"], letter
