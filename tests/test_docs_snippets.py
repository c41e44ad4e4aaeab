"""Docs that cannot rot: every snippet in README.md and docs/ is checked against the code.

* A YAML block with ``name:`` is a whole source: it is written to a temp folder (as the file its
  first comment names, ``# items.yaml``, else ``source.yaml``) with the seed file and suite it
  refers to, and checked with ``collector validate``.
* A YAML block without ``name:`` is part of a source: its keys must be source sections, and it
  is merged into a minimal source and validated the same way.
* A YAML block with ``deployments:`` must agree with deployments/prefect.yaml, key by key.
* A block marked ``<!-- fragment -->`` on the line before is skipped (keep them few).
* A JSON block with ``expectations`` is a GX suite, checked like a source's suite.
* Every ``collector ...`` command in a shell block is parsed by the real parser; ``init``,
  ``validate`` and ``schema`` are run, in page order, in the page's temp folder. Inline
  ``collector ...`` code spans are parsed too (missing arguments allowed: prose names commands;
  an upper-case placeholder such as ``collector COMMAND --help``, or ``...``, stands for any
  command; what follows a pipe is not the command's).
* Python blocks compile; relative links in README.md point at files that exist.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from collector.config import Source
from collector.settle.suite import check_suite_file
from flows.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FRAGMENT = "<!-- fragment -->"
MAX_FRAGMENTS = 3
BASE_SOURCE: dict[str, Any] = {
    "name": "docs-snippet",
    "seeds": {"urls": ["https://shop.example/api/items/1.json"]},
    "record": {"key": "id"},
    "sink": {"type": "jsonl", "path": "out"},
}
MINIMAL_SUITE = {
    "name": "docs",
    "expectations": [{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}],
}
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(?<!`)`(collector [^`]+)`(?!`)")
_SHELL_ENDS = {"|", "||", "&&", ";", ">", ">>", "&", "2>"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    text: str
    fragment: bool

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match.group(1), match.group(2), before.strip() == FRAGMENT))
    return found


def shell_commands(text: str) -> Iterator[list[str]]:
    """Each ``collector ...`` command of a shell block, as argv (without ``collector``)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        if not line.startswith("collector "):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = []
        for word in lexer:
            if word in _SHELL_ENDS:
                break
            words.append(word)
        yield words[1:]


class _ParseError(Exception):
    pass


def strict_parser() -> argparse.ArgumentParser:
    """``collector``'s parser, raising instead of exiting, on every subcommand too."""

    def fail(message: str) -> NoReturn:
        raise _ParseError(message)

    parser = build_parser()
    pending = [parser]
    while pending:
        current = pending.pop()
        current.error = fail  # type: ignore[method-assign]  # raise, not exit
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return parser


def parse(argv: list[str], *, partial: bool = False) -> None:
    if partial and argv and re.fullmatch(r"[A-Z][A-Z_]*|\.\.\.", argv[0]):
        return  # prose about any command: `collector COMMAND --help`
    try:
        strict_parser().parse_args(argv)
    except _ParseError as exc:
        if partial and "arguments are required" in str(exc):
            return
        raise AssertionError(f"`collector {shlex.join(argv)}`: {exc}") from None


def run_collector(argv: list[str], folder: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a command in process, in ``folder``; its stdout, or a failure with its stderr."""
    monkeypatch.chdir(folder)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, f"`collector {shlex.join(argv)}` exited {code}: {err.getvalue()}"
    return out.getvalue()


def write_source(
    block: Block, data: dict[str, Any], folder: Path, suites: list[dict[str, Any]]
) -> Path:
    """The source of a snippet, with the files it refers to, in ``folder``."""
    first = block.text.lstrip().splitlines()[0]
    named = re.fullmatch(r"#\s*([\w.-]+\.ya?ml)\s*", first)
    path = folder / (named.group(1) if named else f"source-{block.line}.yaml")
    whole = "name" in data
    path.write_text(block.text if whole else yaml.safe_dump({**BASE_SOURCE, **data}))
    seeds = data.get("seeds") or {}
    if isinstance(seeds.get("file"), str) and not (folder / seeds["file"]).exists():
        (folder / seeds["file"]).write_text("# one URL a line\nhttps://shop.example/a.json\n")
    suite = (data.get("validation") or {}).get("suite")
    if isinstance(suite, str) and not (folder / suite).exists():
        (folder / suite).write_text(json.dumps(suites[0] if suites else MINIMAL_SUITE))
    return path


def check_deployments(block: Block, data: dict[str, Any]) -> None:
    shipped = yaml.safe_load((ROOT / "deployments/prefect.yaml").read_text(encoding="utf-8"))
    by_name = {entry["name"]: entry for entry in shipped["deployments"]}
    for entry in data["deployments"]:
        assert entry["name"] in by_name, (
            f"{block.where}: deployment {entry['name']!r} is not in deployments/prefect.yaml"
        )
        for key, value in entry.items():
            assert by_name[entry["name"]].get(key) == value, (
                f"{block.where}: deployment {entry['name']!r} key {key!r} differs from "
                "deployments/prefect.yaml"
            )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_snippet_of_the_page_holds(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = blocks(page)
    suites = [
        json.loads(b.text) for b in found if b.language == "json" and "expectations" in b.text
    ]
    for block in found:
        if block.fragment:
            continue
        if block.language == "yaml":
            data = yaml.safe_load(block.text)
            assert isinstance(data, dict), f"{block.where}: not a YAML mapping"
            if "deployments" in data:
                check_deployments(block, data)
                continue
            unknown = set(data) - set(Source.model_fields)
            assert not unknown, (
                f"{block.where}: {sorted(unknown)} are not source keys; mark the block with "
                f"{FRAGMENT} if it is not part of a source"
            )
            path = write_source(block, data, tmp_path, suites)
            out = run_collector(["validate", path.name], tmp_path, monkeypatch)
            assert ": ok (" in out, f"{block.where}: {out}"
        elif block.language == "json" and "expectations" in block.text:
            suite = tmp_path / f"suite-{block.line}.json"
            suite.write_text(block.text)
            check_suite_file(suite)
        elif block.language == "python":
            ast.parse(block.text, filename=block.where)
        elif block.language in ("sh", "bash", "console"):
            for argv in shell_commands(block.text):
                parse(argv)
                if argv and argv[0] in ("init", "validate", "schema"):
                    run_collector(argv, tmp_path, monkeypatch)
    for span in _INLINE.findall(page.read_text(encoding="utf-8")):
        for argv in shell_commands(span.replace("\\|", "|")):  # `\|` inside a table cell
            parse(argv, partial=True)


def test_fragments_are_few() -> None:
    fragments = [b.where for page in PAGES for b in blocks(page) if b.fragment]
    assert len(fragments) <= MAX_FRAGMENTS, f"too many unchecked snippets: {fragments}"


def test_readme_links_point_at_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local, "README.md links to its docs"
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_readme_stays_short_and_keeps_the_two_commands_first() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 8 * 1024, "README.md is over 8 KB: move the detail to docs/"
    commands = [b.text.strip() for b in blocks(ROOT / "README.md") if b.language == "sh"]
    assert commands[:2] == ["./bootstrap demo", "./bootstrap test"]


# ------------------------------------------------------------------------------------------
# The checks themselves can fail
# ------------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_wrong_key_in_a_source_snippet_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (block,) = blocks(_write(tmp_path, "```yaml\nttl: {default_fresh: 10}\n```\n"))
    data = yaml.safe_load(block.text)
    path = write_source(block, data, tmp_path, [])
    with pytest.raises(AssertionError, match="exited 2"):
        run_collector(["validate", path.name], tmp_path, monkeypatch)


def test_an_unknown_option_in_a_command_fails() -> None:
    (argv,) = shell_commands("collector run items.yaml --batchsize 5  # a typo\n")
    with pytest.raises(AssertionError, match="unrecognized arguments: --batchsize"):
        parse(argv)
    (argv,) = shell_commands("collector depl0y items.yaml | tail\n")
    with pytest.raises(AssertionError, match="invalid choice"):
        parse(argv, partial=True)
    parse(["run"], partial=True)  # prose may name a command without its arguments
    parse(["COMMAND", "--help"], partial=True)  # or stand for any command
    parse(["..."], partial=True)
    with pytest.raises(AssertionError, match="invalid choice"):
        parse(["COMMAND", "--help"])  # but a shell block shows a real one


def test_a_deployment_snippet_that_drifted_fails(tmp_path: Path) -> None:
    text = "```yaml\ndeployments:\n  - name: backlog-monitor\n    concurrency_limit: 7\n```\n"
    (block,) = blocks(_write(tmp_path, text))
    with pytest.raises(AssertionError, match=r"differs from deployments/prefect\.yaml"):
        check_deployments(block, yaml.safe_load(block.text))


def test_a_fragment_marker_is_seen(tmp_path: Path) -> None:
    text = "Text.\n\n<!-- fragment -->\n```yaml\nnot: a source\n```\n\n```yaml\nname: x\n```\n"
    first, second = blocks(_write(tmp_path, text))
    assert first.fragment and not second.fragment
