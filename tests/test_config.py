"""Source files: loading, seeds, one-line problems naming file and field, env headers, the
JSON schema, and the `collector validate` / `collector schema` commands (collector.config,
flows.cli)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.config import Source, SourceError, load_source, source_json_schema
from collector.errors import ConfigError
from flows.cli import main

SUITE = {
    "name": "items",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
    ],
}


def minimal(**overrides: Any) -> dict[str, Any]:
    source: dict[str, Any] = {
        "name": "items",
        "seeds": {"urls": ["https://example.com/a"]},
        "record": {"key": "id"},
        "sink": {"type": "jsonl", "path": "out"},
    }
    source.update(overrides)
    return source


def write(folder: Path, data: Any, name: str = "source.yaml") -> Path:
    path = folder / name
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(path: Path) -> list[str]:
    with pytest.raises(SourceError) as info:
        load_source(path)
    problems = info.value.problems
    assert problems, "SourceError without problems"
    assert str(info.value) == "\n".join(problems)
    for line in problems:
        assert line.startswith(f"{path}: "), line
        assert "\n" not in line
    return problems


def the_problem(path: Path, field: str) -> str:
    """The problem line about ``field`` (there must be exactly one)."""
    lines = [line for line in problems_of(path) if f": {field}" in line]
    assert len(lines) == 1, problems_of(path)
    return lines[0]


@pytest.fixture
def full_source(tmp_path: Path) -> Path:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "seeds.txt").write_text(
        textwrap.dedent(
            """\
            # seeds for the test
            https://example.com/b

              https://example.com/c
            # https://example.com/commented-out
            https://example.com/a
            https://example.com/d
            """
        ),
        encoding="utf-8",
    )
    (folder / "suite.json").write_text(json.dumps(SUITE), encoding="utf-8")
    data = {
        "name": "items.v1_full-test",
        "description": "everything set",
        "seeds": {
            "urls": ["https://example.com/a", "https://example.com/b", "https://example.com/a"],
            "file": "seeds.txt",
            "template": "https://example.com/items/{i}.json",
            "range": [3, 6],
        },
        "record": {"key": "data.id", "records_path": "items"},
        "sink": {"type": "jsonl", "path": "out"},
        "ttl": {
            "default_fresh_s": 120,
            "rules": [
                {"pattern": r"/items/\d+\.json$", "fresh_s": 30},
                {"prefix": "https://example.com/a", "fresh_s": 5},
            ],
            "queue_ttl_s": 3600,
            "http_timeout_s": 5,
            "request_deadline_s": 8,
            "batch_timeout_s": 60,
            "lease_s": 90,
        },
        "priority": {
            "class": "high",
            "weight": 8,
            "cost": 1.5,
            "aging_per_minute": 2,
            "rules": [{"prefix": "https://example.com/items/", "weight": 3}],
        },
        "retry": {
            "profile": "linear",
            "base_s": 0.1,
            "cap_s": 2,
            "max_attempts": 3,
            "max_total_s": 60,
            "budget_ratio": 0.5,
            "budget_min": 2,
            "respect_retry_after": False,
            "max_retry_after_s": 30,
            "max_inline_delay_s": 1,
        },
        "limits": {
            "concurrency": 8,
            "per_domain_concurrency": 2,
            "per_domain_rate": "10/second",
            "max_response_bytes": 100000,
            "follow_redirects": False,
            "max_redirects": 0,
            "allowed_hosts": ["example.com"],
            "headers": {"Accept": "application/json"},
        },
        "validation": {"suite": "suite.json"},
        "frontier": {"type": "sqlite", "path": "state/f.db"},
        "deadletters": {"type": "sqlite"},
        "allow_private_networks": False,
        "state_dir": "state",
    }
    return write(folder, data)


# --- a valid source ------------------------------------------------------------------------------
def test_full_source_loads(full_source: Path):
    source = load_source(full_source)
    assert isinstance(source, Source)
    assert source.name == "items.v1_full-test"
    assert source.record.key == "data.id"
    assert source.ttl.fresh_for("https://example.com/items/4.json") == 30
    assert source.ttl.fresh_for("https://example.com/a") == 5
    assert source.ttl.fresh_for("https://example.com/zzz") == 120
    assert source.priority.run_class == "high"
    assert source.priority.weight_and_cost("https://example.com/items/4.json") == (3, 1.5)
    assert source.retry.profile == "linear" and source.retry.max_attempts == 3
    assert source.limits.per_domain_rate == "10/second"
    assert source.limits.allowed_hosts == ("example.com",)


def test_seed_order_and_dedupe(full_source: Path):
    urls = list(load_source(full_source).iter_seed_urls())
    assert urls == [
        "https://example.com/a",
        "https://example.com/b",
        "https://example.com/c",
        "https://example.com/d",
        "https://example.com/items/3.json",
        "https://example.com/items/4.json",
        "https://example.com/items/5.json",
    ]


def test_template_range_is_half_open(tmp_path: Path):
    path = write(
        tmp_path, minimal(seeds={"template": "https://example.com/p/{i}", "range": [0, 3]})
    )
    assert list(load_source(path).iter_seed_urls()) == [
        "https://example.com/p/0",
        "https://example.com/p/1",
        "https://example.com/p/2",
    ]
    empty = write(tmp_path, minimal(seeds={"template": "https://x/{i}", "range": [4, 4]}), "e.yaml")
    assert list(load_source(empty).iter_seed_urls()) == []


def test_seed_urls_stream_every_listed_url_repeats_included(full_source: Path):
    source = load_source(full_source)
    streamed = list(source.seed_urls())
    assert list(dict.fromkeys(streamed)) == list(source.iter_seed_urls())
    assert len(streamed) > len(set(streamed))  # the full source lists some URLs twice


@pytest.mark.parametrize(
    "template",
    [
        "https://e.com/p/{i}",
        "https://e.com/p/{i}.json?x=1",
        "https://e.com/{i}/{i}",
        "https://e.com/{{a}}/{i}",
    ],
)
def test_template_fast_path_expands_like_format(tmp_path: Path, template: str):
    path = write(tmp_path, minimal(seeds={"template": template, "range": [7, 12]}))
    assert list(load_source(path).seed_urls()) == [template.format(i=i) for i in range(7, 12)]
    # validate/init count a template by its range: the same as counting its distinct URLs
    from flows.cli._common import seed_count

    assert seed_count(load_source(path)) == len(set(load_source(path).seed_urls())) == 5


def test_seed_mark_follows_what_decides_the_seed_list(full_source: Path):
    mark = load_source(full_source).seed_mark()
    assert mark == load_source(full_source).seed_mark()
    data = yaml.safe_load(full_source.read_text())
    seeds = full_source.parent / data["seeds"]["file"]

    def mark_with(**changes: Any) -> str:
        edited = {**data, **changes}
        write(full_source.parent, edited, "edited.yaml")
        return load_source(full_source.parent / "edited.yaml").seed_mark()

    assert mark_with() == mark
    # a switch of policy plans in full: a carried-over item still queued must be swept
    assert mark_with(seeds={**data["seeds"], "on_removed": "collect"}) != mark
    assert mark_with(seeds={**data["seeds"], "range": [3, 7]}) != mark
    assert mark_with(allow_private_networks=True) != mark
    assert mark_with(limits={**data["limits"], "allowed_hosts": ["other.com"]}) != mark
    seeds.write_text(seeds.read_text() + "https://example.com/z\n")
    assert load_source(full_source).seed_mark() != mark  # the file's contents count


def test_a_template_alone_keeps_its_range_beside_the_digest(tmp_path: Path):
    def mark(**seeds: Any) -> str:
        return load_source(write(tmp_path, minimal(seeds=seeds), "m.yaml")).seed_mark()

    template = "https://e.com/items/{i}.json"
    first = mark(template=template, range=[0, 10])
    assert first.endswith(" range=0,10")
    grown = mark(template=template, range=[0, 20])
    assert grown.partition(" range=")[0] == first.partition(" range=")[0]
    assert grown.endswith(" range=0,20")
    other = mark(template="https://e.com/other/{i}.json", range=[0, 10])
    assert other.partition(" range=")[0] != first.partition(" range=")[0]
    # with urls (or a file) beside it, the range is in the digest: no difference plan
    mixed = mark(template=template, range=[0, 10], urls=["https://e.com/a"])
    assert " range=" not in mixed
    assert mark(template=template, range=[0, 20], urls=["https://e.com/a"]) != mixed


def test_on_removed_accepts_only_its_two_policies(tmp_path: Path):
    good = write(tmp_path, minimal(seeds={"urls": ["https://e.com/a"], "on_removed": "collect"}))
    assert load_source(good).seeds.on_removed == "collect"
    assert load_source(write(tmp_path, minimal(), "d.yaml")).seeds.on_removed == "retire"
    bad = write(
        tmp_path, minimal(seeds={"urls": ["https://e.com/a"], "on_removed": "drop"}), "b.yaml"
    )
    with pytest.raises(SourceError) as caught:
        load_source(bad)
    assert "seeds.on_removed" in str(caught.value)


def test_relative_paths_resolved_against_the_source_folder(
    full_source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    folder = full_source.parent.resolve()
    source = load_source(full_source)
    assert source.base_dir == folder
    assert source.sink_path == folder / "out"
    assert source.state_path == folder / "state"
    assert source.frontier_path == folder / "state" / "f.db"
    assert source.deadletter_path == folder / "state" / "deadletters.db"
    assert source.deadletter_archive_path == folder / "state" / "deadletters.jsonl"
    assert source.suite_path == folder / "suite.json"
    assert "https://example.com/c" in list(source.iter_seed_urls())  # file read from its folder


def test_relative_source_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    write(tmp_path, minimal())
    monkeypatch.chdir(tmp_path)
    assert load_source("source.yaml").sink_path == tmp_path.resolve() / "out"


def test_absolute_paths_kept(tmp_path: Path):
    out = tmp_path / "abs-out"
    source = load_source(write(tmp_path, minimal(sink={"type": "jsonl", "path": str(out)})))
    assert source.sink_path == out


def test_json_source_loads(tmp_path: Path):
    path = tmp_path / "source.json"
    path.write_text(json.dumps(minimal()), encoding="utf-8")
    assert load_source(path).name == "items"


def test_defaults_applied(tmp_path: Path):
    source = load_source(write(tmp_path, minimal()))
    assert source.allow_private_networks is False
    assert source.priority.run_class == "normal"
    assert source.suite_path is None
    assert source.limits.headers == {}


def test_sink_type_may_be_omitted(tmp_path: Path):
    schema = source_json_schema()
    assert schema["$defs"]["JsonlSinkSettings"]["required"] == ["path"]
    source = load_source(write(tmp_path, minimal(sink={"path": "out"})))
    assert source.sink.type == "jsonl"


# --- invalid sources: one line per problem, naming file and field --------------------------------
def test_bad_yaml_names_the_line(tmp_path: Path):
    path = write(tmp_path, "name: items\nseeds:\n  urls: [https://x/a\nrecord: {key: id}\n")
    (line,) = problems_of(path)
    assert "invalid YAML" in line
    assert "line " in line and "column " in line


def test_bad_yaml_tab_indentation_line_number(tmp_path: Path):
    path = write(tmp_path, "name: items\nseeds:\n\turls: []\n")
    (line,) = problems_of(path)
    assert "invalid YAML: line 3" in line


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "", "42\n"])
def test_not_a_mapping(tmp_path: Path, text: str):
    (line,) = problems_of(write(tmp_path, text))
    assert "must be a mapping" in line


def test_missing_file(tmp_path: Path):
    path = tmp_path / "nope.yaml"
    assert problems_of(path) == [f"{path}: file not found"]


def test_unknown_top_level_key(tmp_path: Path):
    line = the_problem(write(tmp_path, minimal(retries={"max": 3})), "retries")
    assert "unknown key" in line


def test_unknown_nested_key(tmp_path: Path):
    line = the_problem(write(tmp_path, minimal(ttl={"leas_s": 900})), "ttl.leas_s")
    assert "unknown key" in line


@pytest.mark.parametrize(
    ("remove", "field"), [("name", "name"), ("sink", "sink"), ("seeds", "seeds")]
)
def test_missing_required_section(tmp_path: Path, remove: str, field: str):
    data = minimal()
    del data[remove]
    line = the_problem(write(tmp_path, data), field)
    assert line == f"{tmp_path / 'source.yaml'}: {field}: required key is missing"


def test_missing_record_key(tmp_path: Path):
    line = the_problem(write(tmp_path, minimal(record={"parser": "json"})), "record.key")
    assert "required key is missing" in line


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("records_path", "data..items", "(did you mean 'data.items'?)"),
        ("records_path", "data.", "(did you mean 'data'?)"),
        ("key", ".id", "(did you mean 'id'?)"),
        ("key", "..", "has an empty part between dots"),
        ("records_path", " ", "is empty"),
    ],
)
def test_a_dotted_path_with_an_empty_part_is_refused_at_load(
    tmp_path: Path, field: str, value: str, says: str
):
    """It matches no document: every page would be dead-lettered, and only after its fetch."""
    record = {"key": "id", field: value}
    line = the_problem(write(tmp_path, minimal(record=record)), f"record.{field}")
    assert says in line, line


def test_dotted_paths_that_can_match_are_kept(tmp_path: Path):
    record = {"key": "data.id", "records_path": "payload.items.0"}
    source = load_source(write(tmp_path, minimal(record=record)))
    assert (source.record.key, source.record.records_path) == ("data.id", "payload.items.0")


def test_invalid_regex_in_rule(tmp_path: Path):
    data = minimal(ttl={"rules": [{"pattern": "items/(", "fresh_s": 5}]})
    line = the_problem(write(tmp_path, data), "ttl.rules[0].pattern")
    assert "invalid regular expression 'items/('" in line


def test_negative_ttl(tmp_path: Path):
    line = the_problem(write(tmp_path, minimal(ttl={"default_fresh_s": -1})), "ttl.default_fresh_s")
    assert "greater than or equal to 0" in line


def test_zero_lease(tmp_path: Path):
    line = the_problem(write(tmp_path, minimal(ttl={"lease_s": 0})), "ttl.lease_s")
    assert "greater than 0" in line


def test_inconsistent_ttl(tmp_path: Path):
    data = minimal(ttl={"batch_timeout_s": 300, "lease_s": 300})
    (line,) = problems_of(write(tmp_path, data))
    assert line.startswith(f"{tmp_path / 'source.yaml'}: ttl: ")
    assert "lease_s" in line and "batch_timeout_s" in line


def test_ftp_seed_url(tmp_path: Path):
    data = minimal(seeds={"urls": ["https://example.com/ok", "ftp://example.com/f"]})
    line = the_problem(write(tmp_path, data), "seeds.urls")
    assert "item 1" in line and "'ftp'" in line


def test_seed_file_missing(tmp_path: Path):
    line = the_problem(write(tmp_path, minimal(seeds={"file": "missing.txt"})), "seeds.file")
    assert str(tmp_path / "missing.txt") in line and "does not exist" in line


def test_seed_file_bad_line(tmp_path: Path):
    (tmp_path / "seeds.txt").write_text(
        "# header\nhttps://example.com/a\n\nnot a url\nhttps://example.com/b\n", encoding="utf-8"
    )
    line = the_problem(write(tmp_path, minimal(seeds={"file": "seeds.txt"})), "seeds.file")
    assert "seeds.file line 4:" in line
    assert "whitespace" in line


def test_seed_file_many_bad_lines_capped(tmp_path: Path):
    (tmp_path / "seeds.txt").write_text("ftp://x/\n" * 100, encoding="utf-8")
    problems = problems_of(write(tmp_path, minimal(seeds={"file": "seeds.txt"})))
    assert 1 <= len(problems) <= 20


def test_seed_file_not_utf8(tmp_path: Path):
    (tmp_path / "seeds.txt").write_bytes(b"https://example.com/\xff\xfe\n")
    line = the_problem(write(tmp_path, minimal(seeds={"file": "seeds.txt"})), "seeds.file")
    assert "not UTF-8" in line


def test_template_without_placeholder(tmp_path: Path):
    data = minimal(seeds={"template": "https://example.com/items", "range": [0, 3]})
    (line,) = problems_of(write(tmp_path, data))
    assert ": seeds: " in line and "template" in line and "{i}" in line


def test_template_without_range(tmp_path: Path):
    data = minimal(seeds={"template": "https://example.com/{i}"})
    (line,) = problems_of(write(tmp_path, data))
    assert ": seeds: " in line and "'template' and 'range' go together" in line


def test_template_with_other_placeholder(tmp_path: Path):
    data = minimal(seeds={"template": "https://example.com/{i}/{j}", "range": [0, 1]})
    (line,) = problems_of(write(tmp_path, data))
    assert ": seeds: " in line and "cannot be formatted" in line


def test_template_expanding_to_bad_url(tmp_path: Path):
    data = minimal(seeds={"template": "ftp://example.com/{i}", "range": [0, 1]})
    line = the_problem(write(tmp_path, data), "seeds.template")
    assert "'ftp'" in line


def test_range_stop_below_start(tmp_path: Path):
    data = minimal(seeds={"template": "https://example.com/{i}", "range": [5, 2]})
    (line,) = problems_of(write(tmp_path, data))
    assert ": seeds: " in line and "range [5, 2)" in line and "stop is below start" in line


def test_empty_seeds(tmp_path: Path):
    (line,) = problems_of(write(tmp_path, minimal(seeds={})))
    assert ": seeds: " in line and "at least one of" in line


def test_bad_rate(tmp_path: Path):
    data = minimal(limits={"per_domain_rate": "fast"})
    line = the_problem(write(tmp_path, data), "limits.per_domain_rate")
    assert "'fast' is not a rate" in line


@pytest.mark.parametrize("name", ["bad name", "", "-leading-dash", "a/b", "x" * 101, "é"])
def test_bad_name(tmp_path: Path, name: str):
    line = the_problem(write(tmp_path, minimal(name=name)), "name")
    assert "is not a valid name" in line


def test_name_with_trailing_newline_refused(tmp_path: Path):
    line = the_problem(write(tmp_path, minimal(name="items\n")), "name")
    assert "is not a valid name" in line


def test_suite_file_missing(tmp_path: Path):
    data = minimal(validation={"suite": "nope.json"})
    line = the_problem(write(tmp_path, data), "validation.suite")
    assert str(tmp_path / "nope.json") in line and "not found" in line


def test_parser_that_does_not_import(tmp_path: Path):
    data = minimal(record={"key": "id", "parser": "no_such_pkg_xyz.parsers:parse"})
    line = the_problem(write(tmp_path, data), "record.parser")
    assert "cannot import module 'no_such_pkg_xyz.parsers'" in line


def test_ttl_hook_that_does_not_import(tmp_path: Path):
    data = minimal(ttl={"hook": "no_such_pkg_xyz:fresh"})
    line = the_problem(write(tmp_path, data), "ttl.hook")
    assert "cannot import module" in line


def test_every_problem_reported_at_once(tmp_path: Path):
    data = {
        "name": "bad name",
        "seeds": {"urls": ["ftp://x/"]},
        "record": {},
        "ttl": {"leas_s": 1, "rules": [{"pattern": "(", "fresh_s": 1}]},
        "limits": {"per_domain_rate": "fast"},
    }
    problems = problems_of(write(tmp_path, data))
    joined = "\n".join(problems)
    for field in (
        "name",
        "seeds.urls",
        "record.key",
        "sink",
        "ttl.leas_s",
        "ttl.rules[0].pattern",
        "limits.per_domain_rate",
    ):
        assert f": {field}: " in joined, field


# --- headers and secrets -------------------------------------------------------------------------
def test_resolved_headers_and_secret_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLLECTOR_TEST_TOKEN", "tok-12345")
    monkeypatch.setenv("COLLECTOR_TEST_USER", "ann")
    headers = {
        "Authorization": "Bearer ${env:COLLECTOR_TEST_TOKEN}",
        "X-Both": "${env:COLLECTOR_TEST_USER}:${env:COLLECTOR_TEST_TOKEN}",
        "Accept": "application/json",
        "X-Literal": "$HOME ${notenv:X}",
    }
    source = load_source(write(tmp_path, minimal(limits={"headers": headers})))
    assert source.resolved_headers() == {
        "Authorization": "Bearer tok-12345",
        "X-Both": "ann:tok-12345",
        "Accept": "application/json",
        "X-Literal": "$HOME ${notenv:X}",
    }
    assert sorted(source.secret_values()) == sorted(["tok-12345", "ann", "tok-12345"])
    # The file itself never holds the secret.
    assert "tok-12345" not in (tmp_path / "source.yaml").read_text(encoding="utf-8")


def test_missing_env_var_names_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("COLLECTOR_TEST_MISSING", raising=False)
    headers = {"Accept": "json", "X-Api-Key": "${env:COLLECTOR_TEST_MISSING}"}
    source = load_source(write(tmp_path, minimal(limits={"headers": headers})))
    with pytest.raises(ConfigError) as info:
        source.resolved_headers()
    message = str(info.value)
    assert message.startswith("limits.headers.X-Api-Key: ")
    assert "COLLECTOR_TEST_MISSING" in message
    assert source.secret_values() == []


def test_empty_env_value_is_not_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLLECTOR_TEST_EMPTY", "")
    source = load_source(
        write(tmp_path, minimal(limits={"headers": {"X-K": "${env:COLLECTOR_TEST_EMPTY}"}}))
    )
    assert source.resolved_headers() == {"X-K": ""}
    assert source.secret_values() == []


# --- schema --------------------------------------------------------------------------------------
def test_schema():
    schema = source_json_schema()
    json.dumps(schema)  # serialisable
    properties = schema["properties"]
    for key in ("seeds", "ttl", "record", "sink", "priority", "retry", "limits"):
        assert key in properties
    assert "base_dir" not in properties
    assert set(schema["required"]) == {"name", "seeds", "record", "sink"}
    priority = schema["$defs"]["PrioritySettings"]["properties"]
    assert "class" in priority and "run_class" not in priority


# --- CLI -----------------------------------------------------------------------------------------
def test_cli_validate_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = write(tmp_path, minimal(name="bad name", ttl={"leas_s": 1}))
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert any(": name: " in line for line in lines)
    assert any(": ttl.leas_s: " in line for line in lines)
    assert "ok" not in captured.out


def test_cli_validate_valid(full_source: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["validate", str(full_source)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert captured.out.startswith(f"{full_source}: ok")
    assert "7 seed URLs" in captured.out


def test_cli_validate_several(
    full_source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    bad = write(tmp_path, "- not a mapping\n", "bad.yaml")
    assert main(["validate", str(full_source), str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"{full_source}: ok" in captured.out
    assert captured.err.strip() == f"{bad}: the file must be a mapping of keys (name, seeds, ...)"


def test_cli_schema(capsys: pytest.CaptureFixture[str]):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "seeds" in schema["properties"]


def test_cli_validate_does_not_import_prefect(full_source: Path, tmp_path: Path):
    bad = write(tmp_path, minimal(ttl={"leas_s": 1}), "bad.yaml")
    code = textwrap.dedent(
        f"""
        import sys
        from flows.cli import main
        codes = [main(["validate", {str(full_source)!r}]), main(["validate", {str(bad)!r}])]
        main(["schema"])
        print("CODES", codes)
        print("PREFECT_IMPORTED", any(m == "prefect" or m.startswith("prefect.")
                                      for m in sys.modules))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "CODES [0, 2]" in result.stdout
    assert "PREFECT_IMPORTED False" in result.stdout
