"""The :class:`Source` model: every section of one source, and what a run reads from it
(paths, seed URLs and the plan mark, resolved ``${env:}`` / ``${secret:}`` values)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    field_validator,
)

from collector import defaults
from collector.config.sections import (
    _NAME_RE,
    _REF,
    DeadLetterSettings,
    FrontierSettings,
    JsonlSinkSettings,
    LimitsSettings,
    LocksSettings,
    MetricsSettings,
    PolitenessSettings,
    PostgresSinkSettings,
    RecordSettings,
    SeedSettings,
    SinkSettings,
    ValidationSettings,
    _Section,
)
from collector.errors import ConfigError
from collector.fleet.schedule import ScheduleSettings
from collector.ops.backlog import BacklogSettings
from collector.policy.priority import PrioritySettings
from collector.policy.retry import RetrySettings
from collector.policy.ttl import TTLSettings
from collector.recovery.repair import RepairRules


class Source(_Section):
    """One source: what to collect, how fresh, how important, how to retry, where it goes."""

    name: str = Field(description="Unique name: letters, digits, '_', '.', '-'.")
    description: str = Field("", description="Free text shown in summaries.")
    seeds: SeedSettings
    record: RecordSettings
    sink: SinkSettings
    ttl: TTLSettings = Field(default_factory=TTLSettings)
    priority: PrioritySettings = Field(default_factory=PrioritySettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    politeness: PolitenessSettings = Field(default_factory=PolitenessSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    frontier: FrontierSettings = Field(default_factory=FrontierSettings)
    deadletters: DeadLetterSettings = Field(default_factory=DeadLetterSettings)
    locks: LocksSettings = Field(default_factory=LocksSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    repair: RepairRules = Field(
        default_factory=RepairRules,
        description="Fixes triage may apply to quarantined records (collector.recovery.repair).",
    )
    backlog: BacklogSettings = Field(default_factory=BacklogSettings)
    schedule: ScheduleSettings = Field(
        default_factory=ScheduleSettings,
        description="When its own deployment runs it, and its most helpers (collector deploy).",
    )
    allow_private_networks: bool = Field(
        False, description="Allow loopback/private hosts (local sites, the demo)."
    )
    state_dir: Path = Field(
        Path(defaults.STATE_DIR), description="Folder for the frontier and dead letters."
    )
    base_dir: Path = Field(
        Path("."), exclude=True, description="Folder of the source file (set by the loader)."
    )

    @field_validator("name")
    @classmethod
    def _name_is_safe(cls, value: str) -> str:
        if not _NAME_RE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid name (1-100 of letters, digits, '_', '.', '-')"
            )
        return value

    # --- resolved paths -------------------------------------------------------------------
    def path(self, value: Path) -> Path:
        return value if value.is_absolute() else (self.base_dir / value)

    @property
    def state_path(self) -> Path:
        return self.path(self.state_dir)

    @property
    def frontier_path(self) -> Path:
        return self.path(self.frontier.path or self.state_dir / "frontier.db")

    @property
    def deadletter_path(self) -> Path:
        return self.path(self.deadletters.path or self.state_dir / "deadletters.db")

    @property
    def deadletter_archive_path(self) -> Path:
        return self.path(self.deadletters.archive or self.state_dir / "deadletters.jsonl")

    @property
    def ledger_path(self) -> Path:
        """The durable ledger of compensations (collector.run.ledger.LedgerBook)."""
        return self.state_path / "ledger.jsonl"

    @property
    def sink_path(self) -> Path:
        """The JSONL sink's folder (a ConfigError for other sinks: they have no folder)."""
        if not isinstance(self.sink, JsonlSinkSettings):
            raise ConfigError(f"sink: type {self.sink.type!r} has no path")
        return self.path(self.sink.path)

    @property
    def sink_label(self) -> str:
        """Where records go, for messages, without resolving any secret."""
        if isinstance(self.sink, PostgresSinkSettings):
            return f"postgres table {self.sink.table}"
        return str(self.sink_path)

    @property
    def suite_path(self) -> Path | None:
        """The suite file; an inline suite is written to ``<state_dir>/suites/<name>.json``."""
        suite = self.validation.suite
        if isinstance(suite, dict):
            return write_inline_suite(suite, self.state_path / "suites" / f"{self.name}.json")
        return self.path(suite) if suite else None

    # --- seeds -----------------------------------------------------------------------------
    def iter_seed_urls(self) -> Iterator[str]:
        """Every seed URL once, in a stable order: urls, then file lines, then the template.

        Keeps every URL in memory to drop repeats; a run streams :meth:`seed_urls` instead
        (the frontier tells repeats apart by the run's tag).
        """
        seen: set[str] = set()
        for url in self.seed_urls():
            if url not in seen:
                seen.add(url)
                yield url

    def seed_urls(self) -> Iterator[str]:
        """Every seed URL as listed (repeats included), one at a time: constant memory."""
        yield from self.seeds.urls
        if self.seeds.file is not None:
            with self.path(self.seeds.file).open(encoding="utf-8") as lines:
                yield from _url_lines(lines)
        if self.seeds.range is not None:
            yield from self.template_urls(*self.seeds.range)

    def seed_count(self) -> int:
        """How many seed URLs the list names, repeats included (an upper bound of what a first
        plan queues): the urls, the seed file's URL lines (read, not kept), the range's length.
        What the autoscaler expects of a source never planned (collector.fleet.forecast)."""
        count = len(self.seeds.urls)
        if self.seeds.file is not None:
            with self.path(self.seeds.file).open(encoding="utf-8") as lines:
                count += sum(1 for _ in _url_lines(lines))
        if self.seeds.range is not None:
            start, stop = self.seeds.range
            count += max(0, stop - start)
        return count

    def template_urls(self, start: int, stop: int) -> Iterator[str]:
        """The template's URLs for ``i`` in ``[start, stop)`` (none without a template)."""
        template = self.seeds.template
        if template is None:
            return
        head, _, tail = template.partition("{i}")
        if "{" in head + tail or "}" in head + tail:
            for i in range(start, stop):
                yield template.format(i=i)
        else:  # the common case: plain text around one {i} (3 x faster than format)
            for i in range(start, stop):
                yield f"{head}{i}{tail}"

    def seed_list_head(self) -> bytes | None:
        """The ``urls`` as the lines a copy of the list starts with (collector.run.seedlist).

        None when the list cannot be kept as a copy: it has a template (its range has marks of
        its own), or a literal URL would not read back as itself from a line of text (empty,
        surrounded by spaces, holding a line break, or starting with ``#``).
        """
        if self.seeds.template is not None:
            return None
        for url in self.seeds.urls:
            if not url or url != url.strip() or "\n" in url or "\r" in url or url[0] == "#":
                return None
        return "".join(f"{url}\n" for url in self.seeds.urls).encode("utf-8")

    def seed_list_blocks(self, head: bytes) -> Iterator[bytes]:
        """The listed seeds as bytes: ``head`` (:meth:`seed_list_head`), then the seed file's."""
        if head:
            yield head
        if self.seeds.file is not None:
            with self.path(self.seeds.file).open("rb") as handle:
                while block := handle.read(1 << 20):
                    yield block

    def seed_mark(self, *, list_digest: str | None = None) -> str:
        """A digest of everything that decides the seed list a plan offers and refuses.

        The seed settings, the seed file's contents, and the host policy. A plan whose mark
        equals the one the frontier kept from the last finished plan need not offer the list
        again (collector.run.collection.Collection.plan). ``on_removed`` counts too: items an
        earlier ``collect`` plan carried over are still queued, and a switch to ``retire`` must
        sweep them, which only a full plan does.

        The part a plan can difference is kept out of the digest and after it, so a plan can
        tell that only that part changed:

        - a template alone: ``sha256:<hex> range=<start>,<stop>``
          (collector.run.seeds.range_change);
        - ``urls`` and/or a ``file`` without a template: ``sha256:<hex> list=<hex>``, the second
          digest over the listed seeds' bytes (:meth:`seed_list_blocks`; ``list_digest`` when
          the caller hashed them already: collector.run.seedlist).
        """
        digest = hashlib.sha256()
        settings = self.seeds.model_dump(mode="json")
        template_only = not self.seeds.urls and self.seeds.file is None
        head = self.seed_list_head()
        if template_only:
            settings.pop("range", None)
        elif head is not None:
            settings.pop("urls", None)
            settings.pop("file", None)
        policy = [self.allow_private_networks, sorted(self.limits.allowed_hosts)]
        digest.update(json.dumps(["seeds/3", settings, policy], sort_keys=True).encode())
        if head is not None:
            if list_digest is None:
                listed = hashlib.sha256()
                for block in self.seed_list_blocks(head):
                    listed.update(block)
                list_digest = listed.hexdigest()
            return f"sha256:{digest.hexdigest()} list={list_digest}"
        for block in self.seed_list_blocks(b""):  # the seed file's bytes (a template beside it)
            digest.update(block)
        mark = "sha256:" + digest.hexdigest()
        if template_only and self.seeds.range is not None:
            start, stop = self.seeds.range
            mark += f" range={start},{stop}"
        return mark

    def resolve(self, value: str, *, field: str) -> str:
        """Replace ``${env:NAME}`` and ``${secret:NAME}`` in ``value``.

        A missing variable or Secret block is a ConfigError naming ``field``. Secret blocks are
        loaded here, at the start of a run, never when a source is only loaded or validated.
        """

        def substitute(match: re.Match[str]) -> str:
            kind, name = match.groups()
            if kind == "secret":
                from collector.ops.secrets import load_secret

                return load_secret(name, field=field)
            if name not in os.environ:
                raise ConfigError(f"{field}: environment variable {name} is not set")
            return os.environ[name]

        return _REF.sub(substitute, value)

    def resolve_env(self, value: str, *, field: str) -> str:
        """The older name of :meth:`resolve`, kept for its callers."""
        return self.resolve(value, field=field)

    def resolved_headers(self) -> dict[str, str]:
        """Headers with ``${env:NAME}`` / ``${secret:NAME}`` replaced (see :meth:`resolve`),
        and ``politeness.user_agent`` as the User-Agent unless a header names one."""
        headers = {
            name: self.resolve_env(value, field=f"limits.headers.{name}")
            for name, value in self.limits.headers.items()
        }
        agent = self.politeness.user_agent
        if agent and not any(name.lower() == "user-agent" for name in headers):
            headers["User-Agent"] = agent
        return headers

    @property
    def user_agent(self) -> str:
        """The User-Agent the source's requests carry and robots.txt is matched against: a
        header's, resolved as :meth:`resolved_headers` resolves it for the engine, else the
        setting, else the default. As written, a ``${env:UA}`` header was a name no site sees
        and no robots.txt rule matches.

        A ``${secret:...}`` in it loads its Secret block, as a run's start does (a ConfigError
        naming the header when a variable or block is missing): callers that only check a
        source look at :attr:`user_agent_header` first.
        """
        header = self.user_agent_header
        if header is not None:
            name, value = header
            return self.resolve(value, field=f"limits.headers.{name}")
        return self.politeness.user_agent or defaults.USER_AGENT

    @property
    def user_agent_header(self) -> tuple[str, str] | None:
        """The ``limits.headers`` User-Agent as written, (its name as spelt, its value)."""
        for name, value in self.limits.headers.items():
            if name.lower() == "user-agent":
                return name, value
        return None

    def secret_values(self) -> list[str]:
        """Values that must never appear in logs, artifacts or dead letters."""
        from collector.ops.secrets import known_secret

        values = []
        urls = [self.frontier.url, self.deadletters.url, self.limits.rate_storage]
        if isinstance(self.sink, PostgresSinkSettings):
            urls.append(self.sink.dsn)
        for value in [*self.limits.headers.values(), *urls]:
            if not value:
                continue
            for kind, name in _REF.findall(value):
                secret = os.environ.get(name) if kind == "env" else known_secret("secret", name)
                if secret:
                    values.append(secret)
        for block in (self.frontier.block, self.deadletters.block):
            password = known_secret("redis", block) if block else None
            if password:
                values.append(password)
        return values


def write_inline_suite(suite: dict[str, Any], target: Path) -> Path:
    """Write an inline suite where the GX runtime and the validation worker read suites from.

    Rewritten only when its content changed, atomically, so a reader never sees half a suite.
    """
    text = json.dumps(suite, indent=2, sort_keys=True)
    try:
        current = target.read_text(encoding="utf-8")
    except OSError:
        current = None
    if current != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, target)
    return target


def _url_lines(lines: Iterable[str]) -> Iterator[str]:
    """A seed file's URLs: its lines stripped, blank ones and ``#`` comments left out."""
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            yield line
