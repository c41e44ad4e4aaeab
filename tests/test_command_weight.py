"""Each everyday command imports only what it uses: neither Prefect nor GX unless it talks to
the API or must ask GX, and ``--help`` not even the engine's HTTP stack or models.

Measured the way that cannot drift with the box's load: the modules a command left in
``sys.modules``, in a fresh interpreter (the wall times are bench/cold_start.py's and
docs/performance.md's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PRICE_EXPECTATIONS, write_source, write_suite

ROOT = Path(__file__).resolve().parents[1]

# Runs one command in-process, quietly, then says which top-level packages it imported.
PROBE = """
import contextlib, io, json, sys
from flows.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:
        code = exc.code
print(json.dumps({"code": code, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""

NEVER_WITHOUT_THE_API = {"prefect", "great_expectations"}
NOT_FOR_HELP = NEVER_WITHOUT_THE_API | {"pydantic", "aiohttp", "httpx", "yaml", "pandas"}


def imported_by(*argv: str, cache: Path, cwd: Path) -> tuple[int, set[str]]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "COLLECTOR_CACHE_DIR": str(cache),
        "PREFECT_API_URL": "http://127.0.0.1:9/api",  # nothing may reach for it
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return int(report["code"] or 0), set(report["modules"])


@pytest.fixture
def plain_source(tmp_path: Path) -> Path:
    return write_source(tmp_path, seeds={"urls": ["http://127.0.0.1:9/a.json"]})


def test_help_imports_neither_the_engine_nor_prefect_nor_gx(tmp_path: Path) -> None:
    code, modules = imported_by("--help", cache=tmp_path / "cache", cwd=tmp_path)
    assert code == 0
    assert not modules & NOT_FOR_HELP, modules & NOT_FOR_HELP


@pytest.mark.parametrize(
    "argv",
    [
        ("schema",),
        ("validate", "{source}"),
        ("status", "{source}"),
        ("deadletters", "list", "{source}"),
    ],
    ids=" ".join,
)
def test_local_commands_import_neither_prefect_nor_gx(
    argv: tuple[str, ...], plain_source: Path, tmp_path: Path
) -> None:
    args = [part.format(source=plain_source) for part in argv]
    code, modules = imported_by(*args, cache=tmp_path / "cache", cwd=tmp_path)
    assert code == 0
    assert not modules & NEVER_WITHOUT_THE_API, modules & NEVER_WITHOUT_THE_API


def test_validate_asks_gx_once_per_suite_content(tmp_path: Path) -> None:
    """The first validate of a suite imports GX; the next ones of the same bytes do not; an
    edit to the suite asks GX again."""
    suite = write_suite(tmp_path / "suite.json", PRICE_EXPECTATIONS)
    source = write_source(
        tmp_path,
        seeds={"urls": ["http://127.0.0.1:9/a.json"]},
        validation={"suite": "suite.json"},
    )
    cache = tmp_path / "cache"
    first = imported_by("validate", str(source), cache=cache, cwd=tmp_path)
    again = imported_by("validate", str(source), cache=cache, cwd=tmp_path)
    assert (first[0], again[0]) == (0, 0)
    assert "great_expectations" in first[1]
    assert "great_expectations" not in again[1]

    write_suite(suite, PRICE_EXPECTATIONS[:2])
    edited = imported_by("validate", str(source), cache=cache, cwd=tmp_path)
    assert edited[0] == 0 and "great_expectations" in edited[1]
