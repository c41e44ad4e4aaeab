"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor, no
page left out of the nav. Nothing is skipped: mkdocs and mkdocs-material are in the dev extra."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(project)},
    )


def copy_project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir(parents=True)
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    return project


def test_the_site_builds_strict(tmp_path: Path) -> None:
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "source" / "index.html").is_file()
    assert (tmp_path / "site" / "deadletters" / "index.html").is_file()


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    page = project / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [the TTLs](sources.md#no-such-heading).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path) -> None:
    project = copy_project(tmp_path)
    page = project / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [gone](gone.md).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0 and "gone.md" in done.stderr
    project = copy_project(tmp_path / "again")
    (project / "docs" / "orphan.md").write_text("# Orphan\n")
    done = build(project, tmp_path / "site2")
    assert done.returncode != 0 and "orphan.md" in done.stderr
