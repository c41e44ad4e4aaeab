"""The fast lane (``pytest -m "not slow"``, ``./bootstrap test --fast``) keeps a part of every
test file, unless the file is end to end on purpose (listed in tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.lanes import END_TO_END_FILES, LONGEST_FIRST, collected

ROOT = Path(__file__).resolve().parents[1]

# Files whose every test starts a Prefect server or runs flows end to end, on purpose.
SLOW_ONLY = END_TO_END_FILES | {
    "test_audit_end_to_end.py", "test_backlog_flow.py", "test_circuit_flow.py",
    "test_collect_flow.py", "test_deadletters_end_to_end.py", "test_repaired_page_lives_on.py",
    "test_secrets.py", "test_seed_changes.py", "test_source_changed.py",
    "test_page_is_the_record.py", "test_politeness_run.py", "test_quarantine_scenario.py",
    "test_fleet_flow.py",
}  # fmt: skip


def _lanes() -> dict[str, bool]:
    """Test file -> has a fast test: what this session collected when it collected every file
    (the suite, the fast lane), else a collection of the whole suite in a subprocess."""
    files = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    if files <= collected.keys():
        return dict(collected)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-m", "not slow", "-n", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    fast = {Path(line.split("::")[0]).name for line in done.stdout.splitlines() if "::" in line}
    return {name: name in fast for name in files}


def test_every_test_file_has_fast_tests_or_is_slow_only_on_purpose() -> None:
    lanes = _lanes()
    without_fast = {name for name, fast in lanes.items() if not fast}
    listed = SLOW_ONLY & lanes.keys()
    assert without_fast == listed, (
        f"no fast test and not listed as slow only: {sorted(without_fast - listed)}; "
        f"listed as slow only but has fast tests: {sorted(listed - without_fast)}"
    )


def test_the_longest_first_order_names_test_files_that_exist_once_each() -> None:
    """A renamed or removed file left in LONGEST_FIRST ranks nothing, and the file under its new
    name is sent after every listed one (where test_warm_start.py, unlisted, ran alone last)."""
    files = {path.name for path in (ROOT / "tests").glob("test_*.py")}
    assert [name for name in LONGEST_FIRST if name not in files] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
