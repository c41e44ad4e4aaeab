"""The Redis Lua scripts say what they take, and name what they read.

Each script opens with its signature: a comment line per key and argument (``-- KEYS[1] ...``,
``-- ARGV[2] ...``, ``-- ARGV[3..] ...`` for a variable tail, ``-- ARGV     none``), so a reader
of one file knows what the caller sends without the Python beside it. These tests hold the
signatures to the code: every key and argument a script reads (itself or through its prelude)
is named, the names run from 1 without a gap, and a replayed script names its reply record as
its last key. The frontier's records are read by field name (``rec[F_STATE]``), never by
position, and every name a prelude defines is used by some script (luacheck is told the
prelude's names are used: .luacheckrc).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from collector.deadletter import redis as dl_redis
from collector.frontier import redis as fr_redis

ROOT = Path(__file__).resolve().parents[1]
# (package folder, its prelude or None, the scripts it replays)
BACKENDS = [
    ("collector/frontier/lua", "prelude", fr_redis._REPLAYED),
    ("collector/deadletter/lua", "prelude", dl_redis._REPLAYED),
    ("collector/fetch/lua", None, frozenset()),
]
SCRIPTS = [
    (folder, prelude, replayed, path.stem)
    for folder, prelude, replayed in BACKENDS
    for path in sorted((ROOT / folder).glob("*.lua"))
    if path.stem != prelude
]
_DECLARED = re.compile(r"\b(KEYS|ARGV)\[(\d+)(\.\.)?\]")
_READ = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")
_TOP_LEVEL = re.compile(r"^local (?:function )?([A-Za-z_][\w, ]*?)\s*(?:=|\(|$)", re.MULTILINE)


def _split(text: str) -> tuple[list[str], str]:
    """The leading comment block's lines, and the code after it without its comments."""
    lines = text.splitlines()
    n = 0
    while n < len(lines) and lines[n].startswith("--"):
        n += 1
    code = "\n".join(line.split("--", 1)[0] for line in lines[n:])
    return lines[:n], code


def _code(text: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def _signature(head: list[str]) -> dict[str, dict[int, bool]]:
    """``{"KEYS": {index: is_a_tail}, "ARGV": {...}}`` from the signature lines."""
    found: dict[str, dict[int, bool]] = {"KEYS": {}, "ARGV": {}}
    for line in head:
        if line.startswith(("-- KEYS[", "-- ARGV[")):
            for kind, index, tail in _DECLARED.findall(line):
                found[kind][int(index)] = bool(tail)
    return found


@pytest.mark.parametrize(("folder", "prelude", "replayed", "name"), SCRIPTS)
def test_each_script_opens_with_its_keys_and_argv(
    folder: str, prelude: str | None, replayed: frozenset[str], name: str
) -> None:
    head, code = _split((ROOT / folder / f"{name}.lua").read_text(encoding="utf-8"))
    where = f"{folder}/{name}.lua"
    signature = _signature(head)
    if prelude is not None:
        code += "\n" + _code((ROOT / folder / f"{prelude}.lua").read_text(encoding="utf-8"))
    takes_no_argv = any(line.split() == ["--", "ARGV", "none"] for line in head)
    assert signature["KEYS"], f"{where}: its opening comment names no KEYS[n]"
    assert signature["ARGV"] or takes_no_argv, f"{where}: no ARGV[n] (or '-- ARGV     none')"
    for kind, declared in signature.items():
        indexes = sorted(declared)
        assert indexes == list(range(1, len(indexes) + 1)), f"{where}: {kind} {indexes}: a gap"
        assert not any(declared[i] for i in indexes[:-1]), f"{where}: {kind}[n..] is not last"
        tail = indexes[-1] if indexes and declared[indexes[-1]] else None
        read = {int(i) for k, i in _READ.findall(code) if k == kind}
        if kind == "KEYS" and name in replayed and indexes:
            read.add(indexes[-1])  # REPLAY_LUA reads KEYS[#KEYS]
        unnamed = {i for i in read if i not in declared and (tail is None or i < tail)}
        assert not unnamed, f"{where}: reads {kind}{sorted(unnamed)} without naming them"
        unused = [
            i
            for i in indexes
            if not declared[i]
            and i not in read
            and not any(f"{kind}[{i}]" in line and "(unused" in line for line in head)
        ]
        assert not unused, f"{where}: names {kind}{unused} but never reads them"
    keys = [line for line in head if line.startswith("-- KEYS[")]
    records = [line for line in keys if "reply record" in line]
    if name in replayed:  # REPLAY_LUA reads KEYS[#KEYS]
        assert records == keys[-1:], f"{where}: a replayed script's last KEY is its reply record"
    else:
        assert not records, f"{where}: names a reply record but is not replayed"


def test_frontier_records_are_read_by_field_name() -> None:
    folder = ROOT / "collector/frontier/lua"
    for path in sorted(folder.glob("*.lua")):
        positional = re.findall(r"\brec\[\d+\]", _code(path.read_text(encoding="utf-8")))
        assert not positional, f"{path.name}: {positional}: use the prelude's F_ names"


@pytest.mark.parametrize("folder", ["collector/frontier/lua", "collector/deadletter/lua"])
def test_every_name_a_prelude_defines_is_used_by_a_script(folder: str) -> None:
    prelude = (ROOT / folder / "prelude.lua").read_text(encoding="utf-8")
    names = {n.strip() for group in _TOP_LEVEL.findall(prelude) for n in group.split(",")}
    assert {"load", "F_STATE"} <= names or {"esc", "P"} <= names, names  # the parse works
    scripts = [
        _code(p.read_text(encoding="utf-8"))
        for p in (ROOT / folder).glob("*.lua")
        if p.stem != "prelude"
    ]
    # a name is used by a script, or by the prelude's own code after its definition
    unused = sorted(
        n
        for n in names
        if not any(re.search(rf"\b{n}\b", s) for s in scripts)
        and len(re.findall(rf"\b{n}\b", _code(prelude))) < 2
    )
    assert not unused, f"{folder}/prelude.lua defines {unused}; no script uses them"
