"""``retry.max_retry_after_s`` above every retry window: ``collector validate`` says so.

No retry is scheduled past ``max_total_s`` (a profile's ``max_duration_s``) after the first
attempt, so a clamp above the longest window promises waits that never happen: the page asked to
wait longer is dead-lettered at its first try. The warning is checked here, and what it says
against a real local site answering 429 with a long Retry-After.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from collector.config import load_source, source_warnings
from collector.demo.site import FaultSite
from collector.fetch.engine import FetchEngine
from collector.frontier.base import ClaimedItem
from collector.policy.retry import RetryBudget
from collector.policy.urls import HostPolicy
from flows.cli import main
from tests.helpers import write_source


def _warned(tmp_path: Path, **retry: Any) -> list[str]:
    path = write_source(tmp_path, seeds={"urls": ["http://127.0.0.1/a"]}, retry=retry)
    return [w for w in source_warnings(load_source(path)) if "max_retry_after_s" in w]


def test_validate_warns_in_one_line_naming_the_file_and_both_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1/a"]},
        retry={"max_retry_after_s": 3600, "max_total_s": 900},
    )
    assert main(["validate", str(path)]) == 0  # a warning, not a problem
    lines = [line for line in capsys.readouterr().err.splitlines() if "max_retry_after_s" in line]
    assert lines == [
        f"{path}: warning: retry.max_retry_after_s (3600 s) is above retry.max_total_s (900 s), "
        "the longest retry window: a Retry-After over 900 s ends the page at once as a dead "
        "letter (max_total_exceeded), never waited; raise the window to 3600 s to wait that "
        "long, or lower max_retry_after_s below 900 s to retry sooner than such a server asks"
    ]


@pytest.mark.parametrize(
    ("retry", "warned"),
    [
        ({}, False),  # the defaults (3600 above 900): the ceiling for a longer profile's window
        ({"max_total_s": 60}, False),  # a shorter window only: give up sooner, as asked
        ({"max_retry_after_s": 900, "max_total_s": 900}, False),
        ({"max_retry_after_s": 901, "max_total_s": 900}, True),
        ({"max_retry_after_s": 3600, "respect_retry_after": False}, False),  # nothing waited
        # a profile's window is long enough: the clamp matters there
        (
            {
                "max_retry_after_s": 3600,
                "profiles": {"slow": {"max_duration_s": 3600}},
                "rules": [{"prefix": "http://127.0.0.1/export/", "profile": "slow"}],
            },
            False,
        ),
        (
            {
                "max_retry_after_s": 7200,
                "profiles": {"slow": {"max_duration_s": 3600}},
                "rules": [{"prefix": "http://127.0.0.1/export/", "profile": "slow"}],
            },
            True,
        ),
    ],
)
def test_warned_only_when_a_set_clamp_is_above_every_window(
    tmp_path: Path, retry: dict[str, Any], warned: bool
) -> None:
    found = _warned(tmp_path, **retry)
    assert bool(found) is warned, found
    if "profiles" in retry and warned:
        assert "above retry.profiles.slow's max_duration_s (3600 s)" in found[0], found


async def test_a_retry_after_past_the_window_is_dead_at_its_first_try_as_warned(
    tmp_path: Path, site: FaultSite
) -> None:
    """What the warning says, against the real fault site: with the warned settings a 429
    asking for 1000 s (under the clamp) is not waited: one attempt, dead, max_total_exceeded."""
    path = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1/a"]},
        retry={"max_retry_after_s": 3600, "max_total_s": 900, "max_attempts": 4},
    )
    source = load_source(path)
    assert _warned(tmp_path, max_retry_after_s=3600, max_total_s=900)
    engine = FetchEngine(
        retry=source.retry,
        http_timeout_s=2.0,
        request_deadline_s=3.0,
        host_policy=HostPolicy(allow_private_networks=True),
    )
    url = site.url("/items/1.json?status=429&times=-1&retry_after=1000")
    async with engine:
        (result,) = await engine.fetch_batch(
            [ClaimedItem(url, 0, None, 0.0)], budget=RetryBudget(ratio=1.0, min_retries=10)
        )
    assert result.status == "failed" and result.attempts == 1, result  # attempts were left
    assert result.decision is not None, result
    assert (result.decision.action, result.decision.cause) == ("dead", "max_total_exceeded")
