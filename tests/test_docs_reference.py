"""The generated reference pages are what the code says now, and they say all of it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from collector.config import Source
from flows.cli import build_parser
from tools import gen_docs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", list(gen_docs.pages()), ids=str)
def test_the_page_is_up_to_date(path: Path) -> None:
    expected = gen_docs.pages()[path]
    current = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).exists() else ""
    assert current == expected, f"{path} is out of date: run `{gen_docs.COMMAND}`"


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    """Every pydantic model reachable from ``model``'s fields (unions, lists, dicts too)."""
    if model in seen:
        return
    seen.add(model)
    for field in model.model_fields.values():
        pending: list[Any] = [field.annotation]
        while pending:
            kind = pending.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                _models(kind, seen)
            pending.extend(getattr(kind, "__args__", ()))
            pending.extend(getattr(kind, "__metadata__", ()))
            origin = getattr(kind, "__origin__", None)
            if origin is not None:
                pending.append(origin)


def test_every_key_of_every_section_is_in_the_source_reference() -> None:
    text = gen_docs.source_reference()
    models: set[type[BaseModel]] = set()
    _models(Source, models)
    assert len(models) > 10
    missing = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not field.exclude and f"| `{field.alias or name}` |" not in text
    ]
    assert not missing, missing


def test_every_option_of_every_command_is_in_the_cli_reference() -> None:
    text = gen_docs.cli_reference()
    pending = [("collector", build_parser())]
    options = 0
    while pending:
        path, parser = pending.pop()
        assert f"`{path}`" in text or path == "collector", path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                pending.extend((f"{path} {name}", sub) for name, sub in action.choices.items())
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    options += 1
                    assert f"`{flag}`" in text, f"{path} {flag}"
    assert options > 20


def test_a_new_option_makes_the_page_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path, text in gen_docs.pages().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    assert gen_docs.stale(tmp_path) == []

    from flows.cli import sources

    original = sources.register

    def register_more(commands: Any) -> None:
        original(commands)
        commands.choices["validate"].add_argument("--brand-new", help="an option added later")

    monkeypatch.setattr(sources, "register", register_more)
    assert gen_docs.stale(tmp_path) == [gen_docs.CLI_REFERENCE]
    assert "`--brand-new`" in gen_docs.cli_reference()


def test_check_names_the_command_to_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gen_docs, "ROOT", tmp_path)
    assert gen_docs.main(["--check"]) == 1
    assert "run `python -m tools.gen_docs`" in capsys.readouterr().err
    assert gen_docs.main([]) == 0
    assert gen_docs.main(["--check"]) == 0
