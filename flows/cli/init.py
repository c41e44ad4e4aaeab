"""``collector init NAME``: a new source's files, ready to validate and run.

Like ``scrapy startproject`` or ``prefect init``, it writes what a first real run needs and
nothing else, in the current folder (or ``--dir``):

* ``NAME.yaml``            the source, every section commented (what it does, what to change);
* ``NAME.suite.json``      a Great Expectations suite: drafted from the example page, or a
  starter (the record key is never null);
* ``NAME.deployment.yaml`` the entry to add under ``deployments:`` in deployments/prefect.yaml.

Without ``--from-url`` the seeds are a placeholder, ``https://example.invalid/api/items/{i}.json``:
init says to replace it (exit 0), and ``validate`` and ``run`` refuse the source, in one line
naming the file, until it is replaced, so nothing is ever sent to a placeholder host.

``--from-url URL`` fills the source from one example page: the URL's last numeric path segment
becomes ``{i}`` (``/api/items/17.json`` -> ``/api/items/{i}.json``, ids 0 to 99: from 0, the
example among them), only that host is allowed, and the TTLs and politeness are set for a site
that is not yours. The example page is then read as a run reads it and the suite drafted from
its JSON (flows/cli/_draft.py); init says what it guessed. ``--contact`` goes in the User-Agent.

Files that exist are never overwritten: the command refuses, in one line, before writing any.
It writes all three or none (a failure or Ctrl-C while writing removes what it wrote), so it can
simply be run again. The written source is then checked like ``collector validate`` does (exit
2 if it is not valid; the files stay, to be edited).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from flows.cli._common import EXIT_INVALID, EXIT_OK, print_warnings, seed_count

if TYPE_CHECKING:
    from collector.config import Source
    from flows.cli._common import Commands

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
# A path segment that is an id: digits, alone or before an extension (42, 42.json).
_NUMERIC_SEGMENT = re.compile(r"(\d+)(\.[A-Za-z0-9]+)?")
_IDS_SEEDED = 100  # a first run of --from-url collects this many ids: enough to see it work
# An example's id below this starts the range at 0 (ids counted from there, the example among
# them); a larger one (a timestamp, a sparse id) starts it at the example.
_IDS_FROM_ZERO_BELOW = 10_000
# The seeds of a source written without --from-url: a host under .invalid never resolves (RFC
# 6761), and loading a source refuses such seeds with the line to edit, so the placeholder can
# never be run by mistake (collector.config.placeholder_seed_problem).
PLACEHOLDER_TEMPLATE = "https://example.invalid/api/items/{i}.json"


@dataclass(frozen=True, slots=True)
class _Seeds:
    """The ``seeds:`` section as YAML text, and the host it allows."""

    yaml: str
    host: str | None
    local: bool
    guess: str = ""  # what init guessed, said after writing


def _is_local(host: str) -> bool:
    """Loopback or private: such a source needs ``allow_private_networks: true``."""
    if host == "localhost" or host.endswith((".localhost", ".local")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_private or address.is_loopback or address.is_link_local


def _seeds_from_url(url: str) -> _Seeds:
    """A template with the last numeric path segment as ``{i}``, else the URL itself."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--from-url: {url!r} is not an http(s) URL with a host")
    if "{" in url or "}" in url:
        raise ValueError(f"--from-url: {url!r} has braces; write its seeds by hand")
    if parts.username is not None or parts.password is not None:
        # Never written to a file, never echoed: a run refuses such seeds anyway.
        bare = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        raise ValueError(
            f"--from-url: the URL has credentials (user:password@{parts.hostname}); they are "
            f"not written to a file: give the URL without them ({bare}) and put them in a "
            'header from the environment, e.g. limits.headers: {Authorization: "Basic '
            '${env:SHOP_AUTH}"}'
        )
    host = parts.hostname
    segments = parts.path.split("/")
    numeric = [i for i, segment in enumerate(segments) if _NUMERIC_SEGMENT.fullmatch(segment)]
    if not numeric:
        line = f"  urls: [{json.dumps(url)}]   # add more, or a template with {{i}} and a range\n"
        return _Seeds(line, host, _is_local(host))
    where = numeric[-1]
    match = _NUMERIC_SEGMENT.fullmatch(segments[where])
    assert match is not None
    example = int(match.group(1))
    segments[where] = "{i}" + (match.group(2) or "")
    template = urlunsplit(parts._replace(path="/".join(segments)))
    start, stop = _guessed_range(example)
    return _Seeds(
        f"  template: {json.dumps(template)}\n"
        f"  range: [{start}, {stop}]   # [start, stop) of {{i}}: widen it to the"
        " ids you want\n",
        host,
        _is_local(host),
        f"seeds: {{i}} over range [{start}, {stop}) (the example is {example}): a guess, set "
        "seeds.range to the ids you want",
    )


def _guessed_range(example: int) -> tuple[int, int]:
    """``[start, stop)`` of the ids a first run collects: from 0 when the example's id is
    small (ids are usually counted from there), else from the example; the example always in."""
    if example < _IDS_FROM_ZERO_BELOW:
        return 0, max(_IDS_SEEDED, example + 1)
    return example, example + _IDS_SEEDED


_COMMENTED = re.compile(r"^(\s*[^\s#].*?)\s+# (.*)$")
_COMMENT_COLUMN = 39


def _aligned(text: str) -> str:
    """Line up the comments after values in one column, so the file reads as a table."""
    lines = []
    for line in text.splitlines():
        match = _COMMENTED.match(line)
        if match:
            code, comment = match.groups()
            line = f"{code.ljust(_COMMENT_COLUMN - 1)} # {comment}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def user_agent_line(name: str, contact: str | None) -> str:
    """The ``politeness.user_agent`` line: the source's name and the contact, or unset with
    an example (``validate`` warns while a public host would get Collector's own)."""
    if not contact:
        return (
            f'  user_agent: null                   # set: "{name}/1.0 (+https://you.example/bot;'
            ' you@you.example)"\n'
        )
    said = f"+{contact}" if "://" in contact else contact
    agent = json.dumps(f"{name}/1.0 ({said})")
    return f"  user_agent: {agent}   # who asks, and how a site's operator reaches you\n"


def _checked_contact(contact: str | None) -> str | None:
    """``--contact`` (or the answer on a terminal): a URL or an email, else ValueError."""
    if not contact:
        return None
    contact = contact.strip()
    from collector.config.checks import has_contact

    if not has_contact(contact) or any(ch in contact for ch in "()\r\n"):
        raise ValueError(
            f"--contact: {contact!r} is not a URL (https://...) or an email address; site "
            "operators reach you there"
        )
    return contact


def _asked_contact(args: argparse.Namespace) -> str | None:
    """``--contact``, or asked on a terminal for a source of a real site (not a placeholder)."""
    if args.contact is not None or not args.from_url or not sys.stdin.isatty():
        return args.contact  # type: ignore[no-any-return]
    try:
        return input("contact for the User-Agent (a URL or an email; Enter: set it later): ")
    except EOFError:
        return None


def _source_text(name: str, seeds: _Seeds, suite_file: str, contact: str | None = None) -> str:
    host_line = (
        f"  allowed_hosts: [{json.dumps(seeds.host)}]   # no request leaves this host\n"
        if seeds.host
        else "  allowed_hosts: []                  # e.g. [shop.example]: no request leaves them\n"
    )
    private = "true " if seeds.local else "false"
    return _aligned(f"""\
# {name}: a Collector source. Check it with `collector validate {name}.yaml`, run it with
# `collector run {name}.yaml`. Every key: docs/reference/source.md (or `collector schema`).
name: {name}
description: ""                       # free text shown in summaries

seeds:                                 # which URLs; all forms combine, duplicates removed
{seeds.yaml}
record:
  key: id                              # the field that identifies a record (dotted for nested)
  parser: json                         # or "mypkg.parsers:parse" -> f(url, body) -> list[dict]
  records_path: null                   # e.g. "data.items" when one page holds a list

sink:                                  # where good records go
  type: jsonl
  path: out                            # out/{name}-00001.jsonl, one record a line

ttl:                                   # seconds
  default_fresh_s: 86400               # a page fetched once is not fetched again for a day
  queue_ttl_s: 21600                   # a queued page older than this is counted expired
  http_timeout_s: 10                   # these four must hold: http_timeout_s <=
  request_deadline_s: 15               #   request_deadline_s <= batch_timeout_s < lease_s
  batch_timeout_s: 300
  lease_s: 600

priority:
  class: normal                        # critical | high | normal | low: the Prefect work queue
  weight: 5                            # 1..10 within the queue

retry:
  max_attempts: 4                      # per page, across runs; 404s and other 4xx never retry

limits:                                # be polite to a site that is not yours
  concurrency: 8
  per_domain_concurrency: 4
  per_domain_rate: "5/second"
{host_line}
politeness:                            # what every host sees of you
{user_agent_line(name, contact)}
validation:
  suite: {suite_file}          # Great Expectations; failing records go to the dead letters

allow_private_networks: {private}         # true only for sites on your own machine or network
state_dir: .collector                  # the frontier and dead letters of this source
""")


def _suite_text(name: str) -> str:
    suite = {
        "name": name,
        "expectations": [
            {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
        ],
        "meta": {"notes": "Add expectations: docs/sources.md#validation"},
    }
    return json.dumps(suite, indent=2) + "\n"


def _deployment_text(name: str, source: Path) -> str:
    """The source's deployment as a prefect.yaml entry: the plan ``collector deploy`` writes
    (``collect/source-<name>``, no concurrency limit, ``on_busy: skip`` for its trigger), so
    either path makes the same deployment."""
    import yaml

    from collector.fleet.deploy import plan_named
    from flows.deploy import WARM_BUILD_STEP, WARM_FROM_BUILD_STEP, prefect_yaml_entry

    entry = prefect_yaml_entry(plan_named(name, str(source), command=WARM_FROM_BUILD_STEP))
    build = yaml.safe_dump({"build": [WARM_BUILD_STEP]}, sort_keys=False)
    return f"""\
# Add this entry under `deployments:` in deployments/prefect.yaml, then from the project root:
#   prefect deploy --prefect-file deployments/prefect.yaml --name source-{name}
# Or deploy this file as it is, from the project root (its build step is prefect.yaml's):
#   prefect deploy --prefect-file {source.parent / f"{name}.deployment.yaml"} --name source-{name}
# Or, without editing prefect.yaml:
#   collector deploy {source}
# Runs start warm (docs/workers.md "Warm starts"): `{{{{ warm.command }}}}` is what the build
# step says, the interpreter running `prefect deploy`.
# All three make the same deployment, collect/source-{name}: its queue the source's priority.class,
# a schedule only from a `schedule:` section (add one, then deploy again), an event trigger, no
# concurrency limit (two runs of a source never overlap: its source lock; a triggered one that
# finds it running ends `skipped`). `source` is the path as the workers see it (or block:{name}
# after `collector blocks save`); docs/fleet.md.
{build}{entry}"""


def cmd_init(args: argparse.Namespace) -> int:
    from collector.config import SourceError, load_source, placeholder_seed_problem

    name: str = args.name
    if not _NAME_RE.fullmatch(name):
        print(
            f"collector init: {name!r} is not a valid source name "
            "(1-100 of letters, digits, '_', '.', '-')",
            file=sys.stderr,
        )
        return EXIT_INVALID
    folder = Path(args.dir)
    try:
        seeds = (
            _seeds_from_url(args.from_url)
            if args.from_url
            else _Seeds(
                f"  template: {json.dumps(PLACEHOLDER_TEMPLATE)}   # replace: your site's URL,"
                " {i} runs over range\n"
                "  range: [1, 101]                     # [start, stop), like Python's range()\n",
                None,
                False,
            )
        )
        contact = _checked_contact(_asked_contact(args))
    except ValueError as exc:
        print(f"collector init: {exc}", file=sys.stderr)
        return EXIT_INVALID
    source_path = folder / f"{name}.yaml"
    suite_path = folder / f"{name}.suite.json"
    deployment_path = folder / f"{name}.deployment.yaml"
    files = {
        source_path: _source_text(name, seeds, suite_path.name, contact),
        suite_path: _suite_text(name),
        deployment_path: _deployment_text(name, source_path.resolve()),
    }
    existing = [path for path in files if path.exists()]
    if existing:
        print(
            f"collector init: {existing[0]} already exists; not overwriting anything "
            "(remove it, or choose another NAME or --dir)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    written: list[Path] = []
    path = folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            with path.open("x", encoding="utf-8") as out:  # "x": never replace a file
                written.append(path)
                out.write(text)
    except BaseException as exc:  # Ctrl-C included: all three files, or none of them
        for done in written:
            done.unlink(missing_ok=True)
        if not isinstance(exc, OSError):
            raise
        print(f"collector init: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    try:
        source = load_source(source_path)
    except SourceError as exc:
        # Without --from-url the seeds are the placeholder, refused until edited: that one
        # problem is the next step, not a failure of init; any other is.
        expected = placeholder_seed_problem(PLACEHOLDER_TEMPLATE, str(source_path))
        if args.from_url or exc.problems != [f"{source_path}: seeds.template: {expected}"]:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            return EXIT_INVALID
        for path in files:
            print(f"wrote {path}")
        print(f"next: replace the placeholder seed URL in {source_path} (seeds.template:"
              f" {PLACEHOLDER_TEMPLATE}) with a page of the site to collect,")  # fmt: skip
        print(f"      then `collector validate {source_path}` and `collector run {source_path}`")
        print(f"      (or write it again from one example page: `collector init {name}"
              " --from-url URL`, after removing these files)")  # fmt: skip
        return EXIT_OK
    for path in files:
        print(f"wrote {path}")
    if args.from_url:
        if seeds.guess:
            print(seeds.guess)
        if _drafted_from_example(source, args.from_url, suite_path):
            source = load_source(source_path)  # checked again with the drafted suite
    urls = seed_count(source)
    listed = f"{urls} seed URL{'s' * (urls != 1)}"
    warned = print_warnings(source, str(source_path))  # what `validate` would warn about
    plural = "s" * (len(warned) != 1)
    verdict = f"valid, with {len(warned)} warning{plural} above" if warned else "ok"
    print(f"{source_path}: {verdict} ({name}: {listed}, sink {source.sink_label})")
    print(f"next: edit {source_path.name}, then `collector run {source_path}`")
    print(f"      on Prefect: add {deployment_path.name} to deployments/prefect.yaml")
    return EXIT_OK


def _drafted_from_example(source: Source, url: str, suite_path: Path) -> bool:
    """Read the example page as a run would, draft the suite from its first record, say what
    was guessed; True when the suite file was replaced by the draft."""
    from flows.cli._draft import draft_suite, read_example

    records, how = read_example(source, url)
    if records is None:
        print(f"example {url}: {how}; {suite_path.name} is the starter (the key not null)")
        return False
    print(f"example {url}: {how}")
    draft = draft_suite(records, source.record.key)
    if draft.expectations:
        suite = json.loads(suite_path.read_text(encoding="utf-8"))
        suite["expectations"] = draft.expectations
        suite["meta"] = {
            "notes": f"Drafted by collector init from {url}: a guess from one page; loosen what "
            "may be missing or null (docs/sources.md#validation)"
        }
        pending = suite_path.with_name(suite_path.name + ".draft")
        pending.write_text(json.dumps(suite, indent=2) + "\n", encoding="utf-8")
        pending.replace(suite_path)
    if draft.expectations:
        print(f"  drafted {suite_path.name} from its first record (a guess from one page: "
              "loosen what may be missing or null in others):")  # fmt: skip
    for line in draft.said:
        print(f"    {line}")
    return bool(draft.expectations)


def register(commands: Commands) -> None:
    """Add ``init`` to ``collector``'s parser."""
    init = commands.add_parser(
        "init", help="write a new source file, a starter GX suite and its deployment entry"
    )
    init.add_argument("name", metavar="NAME", help="the source's name (file NAME.yaml)")
    init.add_argument(
        "--from-url",
        metavar="URL",
        default=None,
        help="one example page: its numeric path segment becomes {i}, its host the only one",
    )
    init.add_argument("--dir", default=".", metavar="DIR", help="where to write (default: here)")
    init.add_argument(
        "--contact",
        metavar="URL_OR_EMAIL",
        default=None,
        help="how a site's operator reaches you, put in the User-Agent (asked on a terminal)",
    )
    init.set_defaults(func=cmd_init)
