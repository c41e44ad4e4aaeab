"""``collector init``: the real command writes files that validate, run, and deploy.

Each test runs ``collector init`` as a subprocess (the installed entry point, as a user would),
then checks the result with ``collector validate``, the GX suite, Prefect's own model of
prefect.yaml, and one real run against the local demo site.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from collector.demo.site import FaultSite
from tests.helpers import sink_lines

ROOT = Path(__file__).resolve().parents[1]


def collector(
    *args: str, cwd: Path, timeout: float = 60, api: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if api is not None:
        env["PREFECT_API_URL"] = api
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_init_writes_a_placeholder_source_that_says_what_to_edit(tmp_path: Path) -> None:
    """Without --from-url the seeds are a placeholder: init says to replace it; validate and
    run refuse the source in one line naming the file until it is, so nothing is ever sent to
    a placeholder host."""
    done = collector("init", "shop", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "shop.deployment.yaml",
        "shop.suite.json",
        "shop.yaml",
    ]
    assert "next: replace the placeholder seed URL in shop.yaml" in done.stdout, done.stdout
    assert done.stderr == ""
    text = (tmp_path / "shop.yaml").read_text()
    assert text.count("#") > 20, "the source file explains itself in comments"
    for command in ("validate", "run"):
        refused = collector(command, "shop.yaml", cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.splitlines()
        assert line.startswith("shop.yaml: seeds.template: 'https://example.invalid/"), line
        assert "replace the placeholder seed URL in shop.yaml" in line, line
    assert not (tmp_path / ".collector").exists()  # the run stopped before any store
    # Edited as the line says, it validates (everything else init wrote is fine).
    edited = text.replace("https://example.invalid/", "https://shop.example.org/")
    (tmp_path / "shop.yaml").write_text(edited)
    checked = collector("validate", "shop.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "shop.yaml: ok (shop: 100 seed URLs" in checked.stdout


def test_any_seed_on_a_placeholder_host_is_refused_with_the_line_to_edit(tmp_path: Path) -> None:
    from collector.config import SourceError, load_source
    from tests.helpers import write_source

    (tmp_path / "seeds.txt").write_text("https://shop.example.org/1\nhttp://x.invalid/2\n")
    path = write_source(
        tmp_path, seeds={"urls": ["https://example.invalid/a"], "file": "seeds.txt"}
    )
    with pytest.raises(SourceError) as refused:
        load_source(path)
    where = [problem.split(": ")[1] for problem in refused.value.problems]
    assert where == ["seeds.urls[0]", "seeds.file line 2"], refused.value.problems
    for problem in refused.value.problems:
        assert f"replace the placeholder seed URL in {path}" in problem


def test_the_starter_suite_splits_records_with_great_expectations(tmp_path: Path) -> None:
    from collector.settle.validation import SuiteValidator

    assert collector("init", "shop", cwd=tmp_path).returncode == 0
    result = SuiteValidator(tmp_path / "shop.suite.json").validate([{"id": 1}, {"id": None}])
    assert result.good == [{"id": 1}]
    assert [failure.record for failure in result.bad] == [{"id": None}]


def test_the_deployment_entry_is_one_prefect_understands(tmp_path: Path) -> None:
    from prefect.cli.deploy._models import PrefectYamlModel

    from flows.collect import collect
    from flows.deploy import WARM_BUILD_STEP, WARM_FROM_BUILD_STEP

    assert collector("init", "shop", cwd=tmp_path).returncode == 0
    data = yaml.safe_load((tmp_path / "shop.deployment.yaml").read_text())
    model = PrefectYamlModel.model_validate(data)
    (entry,) = model.deployments
    assert entry.name == "source-shop"  # what `collector deploy` names it
    assert entry.entrypoint is not None and entry.work_pool is not None
    file, function = entry.entrypoint.split(":")
    assert (ROOT / file).is_file() and function == "collect"
    assert set(entry.parameters) <= set(inspect.signature(collect.fn).parameters)
    source = Path(entry.parameters["source"])
    assert source == (tmp_path / "shop.yaml").resolve() and source.is_file()
    assert entry.work_pool.name == "collector"
    # runs start warm: the build step names the interpreter running `prefect deploy`
    assert data["build"] == [WARM_BUILD_STEP]  # deployments/prefect.yaml's
    assert entry.work_pool.job_variables == {"command": WARM_FROM_BUILD_STEP}
    # The queue is the source's priority class, as in deployments/prefect.yaml.
    klass = yaml.safe_load(source.read_text())["priority"]["class"]
    assert entry.work_pool.work_queue_name == klass
    shipped = yaml.safe_load((ROOT / "deployments/prefect.yaml").read_text())
    queues = {d["work_pool"]["work_queue_name"] for d in shipped["deployments"]}
    assert klass in queues


def test_init_refuses_to_overwrite_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "shop.suite.json").write_text("mine")
    done = collector("init", "shop", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "shop.suite.json already exists" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop.suite.json"]
    assert (tmp_path / "shop.suite.json").read_text() == "mine"


def test_a_failed_write_leaves_none_of_the_files(tmp_path: Path) -> None:
    """All three or none: a write that fails part-way removes what this run wrote."""
    (tmp_path / "shop.deployment.yaml").symlink_to(tmp_path / "elsewhere")  # exists() is False
    done = collector("init", "shop", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "cannot write shop.deployment.yaml" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shop.deployment.yaml"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["a b"], "'a b' is not a valid source name"),
        (["x", "--from-url", "ftp://host/1"], "is not an http(s) URL"),
        (["x", "--from-url", "https://host/{x}/1"], "has braces"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = collector("init", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_from_url_makes_a_template_of_the_numeric_segment(tmp_path: Path) -> None:
    url = "https://api.example.org/v2/items/1234.json?lang=en"
    done = collector("init", "api", "--from-url", url, "--dir", "sources", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    source = yaml.safe_load((tmp_path / "sources/api.yaml").read_text())
    assert source["seeds"]["template"] == "https://api.example.org/v2/items/{i}.json?lang=en"
    assert source["seeds"]["range"] == [0, 1235]  # from 0, the example among them
    assert source["limits"]["allowed_hosts"] == ["api.example.org"]
    assert source["allow_private_networks"] is False
    assert collector("validate", "sources/api.yaml", cwd=tmp_path).returncode == 0


def test_from_url_without_a_number_seeds_the_url_itself(tmp_path: Path) -> None:
    done = collector("init", "about", "--from-url", "https://x.example/about", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    source = yaml.safe_load((tmp_path / "about.yaml").read_text())
    assert source["seeds"] == {"urls": ["https://x.example/about"]}


@given(
    prefix=st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), max_size=3),
    ident=st.integers(min_value=0, max_value=10**12),
    extension=st.sampled_from(["", ".json", ".html"]),
    tail=st.sampled_from(["", "/detail", "/reviews/x"]),
)
def test_the_template_gives_back_the_example_url(
    prefix: list[str], ident: int, extension: str, tail: str
) -> None:
    """Whatever the path, the example is a seed URL, with the id as {i}."""
    from flows.cli.init import _seeds_from_url

    url = "https://shop.example/" + "/".join([*prefix, f"{ident}{extension}"]) + tail
    seeds = yaml.safe_load(_seeds_from_url(url).yaml)
    assert seeds["template"].format(i=ident) == url and seeds["template"].count("{i}") == 1
    start, stop = seeds["range"]
    assert start <= ident < stop and stop - start <= max(100, ident + 1)


@pytest.mark.slow
def test_the_first_real_run_of_an_initialised_source(
    tmp_path: Path, site: FaultSite, prefect_api: str
) -> None:
    """Getting started, as a user does it: init from one page of a site, then run it."""
    example = site.url("/items/3.json")
    done = collector("init", "demo-items", "--from-url", example, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    source = yaml.safe_load((tmp_path / "demo-items.yaml").read_text())
    assert source["allow_private_networks"] is True  # the site is on loopback
    ran = collector(
        "run",
        "demo-items.yaml",
        "--max-items",
        "20",
        "--json",
        cwd=tmp_path,
        timeout=300,
        api=prefect_api,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    summary = json.loads(ran.stdout.strip().splitlines()[-1])
    stored = [row["id"] for row in sink_lines(tmp_path / "out")]
    assert summary["discovered"] == 100 and summary["stored"] == 20, summary
    assert len(set(stored)) == 20 and set(stored) <= set(range(0, 100)), stored
