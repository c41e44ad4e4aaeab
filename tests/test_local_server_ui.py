"""The background server's UI shows the runs the terminal started: a `collector run` and a
`collector demo` without PREFECT_API_URL (the background server started exactly as a user's
first command starts it, in a PREFECT_HOME of its own), then the run's page opened in headless
Chromium at the address `collector server status` prints, and as localhost: its name, its three
artifacts (progress, ledger, dead letters) and its logs are on the page.

The page shows nothing of the run when the UI cannot reach its API (issue 32: `/ui-settings`
named the default port 4200, every page said "Can't connect to Server API").
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.demo.site import FaultSite
from tests.helpers import write_source
from tests.prefect_db import seed_home
from tests.test_deploy_e2e import CHROMIUM, CHROMIUM_FLAGS

pytestmark = pytest.mark.slow

COLLECTOR = [sys.executable, "-m", "flows.cli"]
ROOT = Path(__file__).resolve().parents[1]
PAGE_TIMEOUT_MS = 90_000  # a loaded 2-core box renders the UI slowly


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A user's environment: no Prefect API configured, a PREFECT_HOME of its own, Prefect's
    default log level (the suite's WARNING would hide the run's INFO lines from its page)."""
    home = seed_home(tmp_path_factory.mktemp("ui-home"))  # migrated: tests/prefect_db.py
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.pop("PREFECT_PROFILE", None)
    env.pop("PREFECT_UI_URL", None)
    env.update(PREFECT_HOME=str(home), PREFECT_LOGGING_LEVEL="INFO")
    yield env
    _collector(env, "server", "stop")


def _collector(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COLLECTOR, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _server_url(env: dict[str, str]) -> str:
    status = _collector(env, "server", "status", "--json")
    url = json.loads(status.stdout)["local"]
    assert url, f"no local server after the command: {status.stdout} {status.stderr}"
    return str(url)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def _look_at_the_run(url: str, *, name: str, artifacts: list[str], log: str) -> str:
    """Open the run's page; wait for its name, its artifacts and a log line. Returns the dead
    letters artifact's text (opened from the Artifacts tab). A failure says what the page showed.
    """
    from playwright.sync_api import Error, Page, sync_playwright

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `./bootstrap test` installs it"

    def seen(page: Page) -> str:
        return page.inner_text("body")[:2000]

    with sync_playwright() as playwright, _profile() as profile:
        browser = playwright.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True,
            viewport={"width": 1400, "height": 1000},
        )  # fmt: skip
        page = browser.new_page()
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        try:
            page.goto(url)
            page.get_by_text(name, exact=True).first.wait_for()
            page.get_by_text(log).first.wait_for()  # the Logs tab opens first
            page.get_by_text("Artifacts", exact=True).first.click()
            for key in artifacts:
                page.get_by_text(key, exact=True).first.wait_for()
            page.get_by_text(artifacts[-1], exact=True).first.click()  # the dead letters
            page.get_by_text("Dead letters of").first.wait_for()
            return page.inner_text("body")
        except Error as exc:
            raise AssertionError(f"{url}: {exc.message.splitlines()[0]}; the page showed:\n"
                                 f"{seen(page)}") from None  # fmt: skip
        finally:
            browser.close()


class _profile:
    """A fresh Chromium --user-data-dir, removed afterwards."""

    def __enter__(self) -> str:
        import tempfile

        self.folder = tempfile.TemporaryDirectory(prefix="collector-chromium-")
        return self.folder.name

    def __exit__(self, *exc: object) -> None:
        self.folder.cleanup()


def _artifacts(source: str) -> list[str]:
    return [f"collector-{source}-{what}" for what in ("progress", "summary", "deadletters")]


def test_a_runs_page_in_the_background_servers_ui_shows_it(
    env: dict[str, str], tmp_path: Path
) -> None:
    with FaultSite() as site:
        urls = [f"{site.base_url}/items/{i}.json" for i in range(5)]
        source = write_source(
            tmp_path, name="ui-items", seeds={"urls": [*urls, f"{site.base_url}/missing/1.json"]}
        )
        done = _collector(env, "run", str(source), "--json")
    assert "starting a local Prefect server" in done.stderr, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["stored"] == 5 and summary["dead_lettered"] == 1, summary
    api = _server_url(env)
    settings = _get(api.removesuffix("/api") + "/ui-settings")
    assert settings["api_url"] == api, settings  # the UI is told the API it is served with
    name = _get(f"{api}/flow_runs/{summary['run_id']}")["name"]
    ui = api.removesuffix("/api")
    for base in (ui, ui.replace("127.0.0.1", "localhost")):
        page = _look_at_the_run(
            f"{base}/runs/flow-run/{summary['run_id']}", name=name,
            artifacts=_artifacts("ui-items"), log="planned ui-items",
        )  # fmt: skip
        assert "http_404" in page, page


def test_the_demo_says_where_its_run_is_and_the_page_shows_it(env: dict[str, str]) -> None:
    done = _collector(env, "demo")
    assert done.returncode == 0, done.stderr
    ui = _server_url(env).removesuffix("/api")
    found = re.search(r"^\s*(http://\S+/runs/flow-run/(\S+))$", done.stdout, re.MULTILINE)
    assert found, f"the demo did not say where its run is:\n{done.stdout}"
    url, run_id = found.groups()
    assert url.startswith(ui + "/"), (url, ui)
    name = _get(f"{ui}/api/flow_runs/{run_id}")["name"]
    page = _look_at_the_run(url, name=name, artifacts=_artifacts("demo-items"),
                            log="planned demo-items")  # fmt: skip
    assert "http_404" in page and "parse_error" in page, page


def test_a_ui_api_url_the_user_set_for_a_proxy_is_kept(tmp_path: Path) -> None:
    """Behind a proxy the browser must call the proxy's address: a PREFECT_UI_API_URL of the
    user's (in the environment or the active profile) wins over the server's own address."""
    proxy = "https://prefect.example.org/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "PREFECT_UI"))}
    env.update(PREFECT_HOME=str(tmp_path), PREFECT_PROFILES_PATH=str(tmp_path / "profiles.toml"))

    def told(**extra: str) -> str:
        code = "from flows.local_server import server_environment as e; "
        code += "print(e(4567)['PREFECT_UI_API_URL'])"
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, **extra},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert told() == "http://127.0.0.1:4567/api"
    assert told(PREFECT_UI_API_URL=proxy) == proxy
    (tmp_path / "profiles.toml").write_text(
        f'active = "proxied"\n[profiles.proxied]\nPREFECT_UI_API_URL = "{proxy}"\n'
    )
    assert told() == proxy
