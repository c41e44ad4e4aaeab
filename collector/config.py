"""The source file: one YAML document that says everything about one collection.

A source is loaded with :func:`load_source`, which either returns a fully checked
:class:`Source` or raises :class:`SourceError` whose ``problems`` are one line each, naming the
file and the field (``items.yaml: ttl.lease_s: must be greater than batch_timeout_s ...``).
Relative paths inside the file are relative to the file's folder, so a source directory can be
moved or checked in as a whole.

Secrets never live in the file: header values, backend URLs and the Postgres DSN may say
``${env:NAME}`` (an environment variable) or ``${secret:NAME}`` (a Prefect Secret block), resolved
when the run starts (and scrubbed from everything Collector writes); loading a source never
reaches a server.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, Self
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from collector import defaults
from collector._text import quoted
from collector.errors import ConfigError
from collector.ops.backlog import BacklogSettings
from collector.policy.priority import PrioritySettings
from collector.policy.retry import RetrySettings
from collector.policy.ttl import TTLSettings, alignment_problems
from collector.policy.urls import check_url_syntax
from collector.recovery.repair import RepairRules
from collector.sinks._names import DEFAULT_TABLE, check_table_name

__all__ = [
    "AdaptiveSettings",
    "BacklogSettings",
    "CircuitSettings",
    "DeadLetterSettings",
    "FrontierSettings",
    "JsonlSinkSettings",
    "LimitsSettings",
    "PostgresSinkSettings",
    "RecordSettings",
    "SeedSettings",
    "Source",
    "SourceError",
    "ValidationSettings",
    "load_source",
    "source_json_schema",
    "source_warnings",
]

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_REF = re.compile(r"\$\{secret:([A-Za-z0-9][A-Za-z0-9_.-]*)\}")
_REF = re.compile(r"\$\{(env|secret):([A-Za-z0-9_.-]+)\}")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
# Problem lines reported for one source at most (the last then says there are more): every
# problem at once, as long as that stays readable on one screen.
MAX_PROBLEMS = 20


class SourceError(ConfigError):
    """A source file is invalid; ``problems`` holds one actionable line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _placeholder_problem(url: str) -> str | None:
    """A literal URL holding ``{i}``: surely meant as a template (it would be fetched as is)."""
    if "{i}" not in url:
        return None
    return (
        f"{quoted(url)} contains {{i}}, but literal URLs are fetched as written: "
        "to expand a range use seeds.template with seeds.range"
    )


class SeedSettings(_Section):
    """Where the URLs come from; all given forms are combined, duplicates removed."""

    urls: tuple[str, ...] = Field((), description="Literal URLs.")
    file: Path | None = Field(None, description="A text file with one URL a line (# comments).")
    template: str | None = Field(
        None, description="A URL with {i}, expanded over range, e.g. http://host/items/{i}.json"
    )
    range: tuple[int, int] | None = Field(
        None, description="[start, stop) for template's {i}, like Python's range()."
    )
    on_removed: Literal["retire", "collect"] = Field(
        "retire",
        description=(
            "What a run does with items an earlier plan queued that the seed list no longer "
            "names (the source was edited): 'retire' them (state retired, counted in the "
            "ledger, never fetched unless listed again) or 'collect' them once more."
        ),
    )

    @model_validator(mode="after")
    def _template_needs_range(self) -> Self:
        if (self.template is None) != (self.range is None):
            raise ValueError("'template' and 'range' go together")
        if self.template is not None:
            if "{i}" not in self.template:
                raise ValueError(f"template {quoted(self.template)} has no {{i}} placeholder")
            assert self.range is not None
            start, stop = self.range
            if stop < start:
                raise ValueError(f"range [{start}, {stop}) is empty: stop is below start")
            try:
                self.template.format(i=start)
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"template {quoted(self.template)} cannot be formatted: {exc}"
                ) from None
        if not self.urls and self.file is None and self.template is None:
            raise ValueError("give at least one of urls, file, or template with range")
        return self

    @field_validator("urls")
    @classmethod
    def _urls_well_formed(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        problems = []  # every bad item, one line each (see _problems_from)
        for index, url in enumerate(urls):
            reason = check_url_syntax(url) or _placeholder_problem(url)
            if reason is not None:
                problems.append(f"item {index}: {reason}")
                if len(problems) > MAX_PROBLEMS:
                    break
        if problems:
            raise ValueError("\n".join(problems))
        return urls


class RecordSettings(_Section):
    """How a response becomes records and what identifies one."""

    key: str = Field(description="Field that identifies a record (dotted path for nested).")
    parser: str = Field(
        "json", description="'json', or a dotted path to f(url, body: bytes) -> list[dict]."
    )
    records_path: str | None = Field(
        None, description="Dotted path to the list of records inside a JSON document."
    )


class CircuitSettings(_Section):
    """Per-host circuit breaker: stop sending to a host that keeps failing, probe it later."""

    enabled: bool = Field(True, description="false: never open (retry as before).")
    failures: int = Field(
        defaults.CIRCUIT_FAILURES,
        ge=1,
        description="Consecutive recoverable failures (connect, timeout, 5xx, 429) that open it.",
    )
    failure_ratio: float = Field(
        defaults.CIRCUIT_FAILURE_RATIO,
        gt=0,
        le=1,
        description="...or this share of failures among the last `window` responses.",
    )
    window: int = Field(
        defaults.CIRCUIT_WINDOW, ge=2, description="Responses the failure ratio looks at."
    )
    cooldown_s: float = Field(
        defaults.CIRCUIT_COOLDOWN_S, gt=0, description="How long the first opening lasts (s)."
    )
    cooldown_factor: float = Field(
        defaults.CIRCUIT_COOLDOWN_FACTOR,
        ge=1,
        description="Each re-opening (a failed probe) multiplies the cool-down by this.",
    )
    cooldown_max_s: float = Field(
        defaults.CIRCUIT_COOLDOWN_MAX_S, gt=0, description="Longest cool-down (s)."
    )
    jitter: float = Field(
        defaults.CIRCUIT_JITTER, ge=0, lt=1, description="Cool-downs vary +- this share."
    )
    probes: int = Field(
        defaults.CIRCUIT_PROBES,
        ge=1,
        le=100,
        description="Requests let through at once when half-open; one success closes it.",
    )


class AdaptiveSettings(_Section):
    """Per-host concurrency window that follows the host's load (AIMD, like TCP)."""

    enabled: bool = Field(True, description="false: per_domain_concurrency, fixed.")
    start: int = Field(
        defaults.ADAPTIVE_START, ge=1, le=1024, description="Window a host starts with."
    )
    latency_factor: float = Field(
        defaults.ADAPTIVE_LATENCY_FACTOR,
        gt=1,
        description="Latency above its floor x this (and floor + latency_margin_s) shrinks it.",
    )
    latency_margin_s: float = Field(
        defaults.ADAPTIVE_LATENCY_MARGIN_S,
        ge=0,
        description="Latency rises below this many seconds above the floor never count.",
    )
    decrease: float = Field(
        defaults.ADAPTIVE_DECREASE,
        gt=0,
        lt=1,
        description="Window x this on 429, 503, timeouts and refused connections.",
    )


def _switch(value: Any) -> Any:
    """``circuit: false`` / ``adaptive: true`` are short for ``{enabled: ...}``."""
    return {"enabled": value} if isinstance(value, bool) else value


class LimitsSettings(_Section):
    """Politeness and safety limits of the fetch engine."""

    concurrency: int = Field(defaults.CONCURRENCY, ge=1, le=1024, description="Requests in flight.")
    per_domain_concurrency: int = Field(
        defaults.PER_DOMAIN_CONCURRENCY, ge=1, le=1024, description="In flight per host."
    )
    per_domain_rate: str | None = Field(
        None, description="Per-host request rate, e.g. '10/second' or '600/minute'."
    )
    rate_storage: str = Field(
        "memory://",
        description="Where per_domain_rate is counted: memory:// (this worker) or a redis:// URL "
        "(shared by every worker); may be ${env:NAME}.",
    )
    max_response_bytes: int = Field(defaults.MAX_RESPONSE_BYTES, ge=1, description="Body cap.")
    follow_redirects: bool = Field(True, description="Follow 3xx (each hop is checked).")
    max_redirects: int = Field(defaults.MAX_REDIRECTS, ge=0, le=30, description="Hops followed.")
    allowed_hosts: tuple[str, ...] = Field((), description="If set, only these hosts.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Request headers; values may use ${env:NAME}."
    )
    transport: Literal["aiohttp", "httpx"] = Field(
        defaults.TRANSPORT,  # type: ignore[arg-type]
        description="Connection pool under httpx: aiohttp (HTTP/1.1, ~1.6x the pages/s) or "
        "httpx's own (httpcore). Redirects, host checks, timeouts and the size cap are the same.",
    )
    shared_domain_concurrency: bool = Field(
        False,
        description="Also take slots of the Prefect global concurrency limit domain:<host> per "
        "batch, so per_domain_concurrency is shared by every worker (one API call per host and "
        "batch). The limit is created with per_domain_concurrency slots when missing.",
    )
    circuit: CircuitSettings = Field(
        default_factory=CircuitSettings,
        description="Per-host circuit breaker; `false` turns it off (see docs/politeness.md).",
    )
    adaptive: AdaptiveSettings = Field(
        default_factory=AdaptiveSettings,
        description="Per-host adaptive concurrency up to per_domain_concurrency; `false` keeps "
        "per_domain_concurrency fixed.",
    )

    @field_validator("circuit", "adaptive", mode="before")
    @classmethod
    def _on_off(cls, value: Any) -> Any:
        return _switch(value)

    @field_validator("rate_storage")
    @classmethod
    def _storage_known(cls, value: str) -> str:
        if value != "memory://" and not value.startswith(_REDIS_SCHEMES) and not _is_ref(value):
            raise ValueError(f"must be memory:// or a redis:// URL, got {value!r}")
        return value

    @field_validator("per_domain_rate")
    @classmethod
    def _rate_parses(cls, value: str | None) -> str | None:
        if value is not None:
            from limits import parse

            try:
                parse(value)
            except ValueError:
                raise ValueError(
                    f"{value!r} is not a rate like '10/second', '600/minute' or '5 per 1 second'"
                ) from None
        return value


class ValidationSettings(_Section):
    """Great Expectations suite that every batch of records is checked with."""

    suite: dict[str, Any] | Path | None = Field(
        None,
        description="Path to a GX expectation suite JSON file, or the suite itself inline (so a "
        "source kept in a Prefect block carries its suite, editable in the UI).",
    )


def _is_ref(value: str) -> bool:
    """True for a value that is one whole ``${env:NAME}`` or ``${secret:NAME}``."""
    return bool(_ENV_REF.fullmatch(value) or _SECRET_REF.fullmatch(value))


class JsonlSinkSettings(_Section):
    type: Literal["jsonl"] = "jsonl"
    path: Path = Field(description="Folder for *.jsonl files, one JSON record a line.")


class PostgresSinkSettings(_Section):
    """Records in a Postgres table that every worker shares (see collector.sinks.postgres)."""

    type: Literal["postgres"]
    dsn: str = Field(
        description="libpq connection string: postgresql://user@host:5432/dbname or "
        "'host=... dbname=...'; may be or contain ${env:NAME} / ${secret:BLOCK_NAME} (a Prefect "
        "Secret block) to keep the password out of the file."
    )
    table: str = Field(
        DEFAULT_TABLE,
        description="Table (or schema.table) of the records, created when missing; one table "
        "can hold many sources (keyed by source and record key).",
    )

    @field_validator("dsn")
    @classmethod
    def _dsn_shape(cls, value: str) -> str:
        if not (
            value.startswith(("postgresql://", "postgres://")) or "=" in value or _REF.search(value)
        ):
            raise ValueError(
                "must be a postgresql:// URL, 'key=value' pairs, or ${env:NAME} / "
                "${secret:BLOCK_NAME}"
            )
        return value

    @field_validator("table")
    @classmethod
    def _table_is_identifier(cls, value: str) -> str:
        check_table_name(value)
        return value


def _check_backend_url(kind: str, backend: str, url: str | None, block: str | None) -> None:
    if backend == "redis":
        if url and block:
            raise ValueError(f"{kind} type 'redis' takes url or block, not both")
        if block is not None:
            if not block.strip():
                raise ValueError("block must name a RedisDatabase block")
            return
        if not url:
            raise ValueError(
                f"{kind} type 'redis' needs url: redis://host:6379/0 (or ${{env:NAME}}), or "
                "block: the name of a prefect-redis RedisDatabase block"
            )
        if not url.startswith(_REDIS_SCHEMES) and not _is_ref(url):
            raise ValueError(f"url must start with redis://, rediss:// or unix://, got {url!r}")
    elif url is not None or block is not None:
        field = "url" if url is not None else "block"
        raise ValueError(f"{field} is only for type 'redis' (this {kind} is {backend!r})")


class FrontierSettings(_Section):
    type: Literal["sqlite", "redis"] = Field("sqlite", description="Backend of the frontier.")
    path: Path | None = Field(None, description="SQLite file; default <state_dir>/frontier.db.")
    url: str | None = Field(
        None,
        description="Redis URL for type 'redis'; may be ${env:NAME} or ${secret:BLOCK_NAME} to "
        "keep passwords out.",
    )
    block: str | None = Field(
        None, description="Instead of url: the name of a prefect-redis RedisDatabase block."
    )

    @model_validator(mode="after")
    def _backend_fields(self) -> Self:
        _check_backend_url("frontier", self.type, self.url, self.block)
        return self


class DeadLetterSettings(_Section):
    type: Literal["sqlite", "redis"] = Field("sqlite", description="Backend of the store.")
    path: Path | None = Field(None, description="SQLite file; default <state_dir>/deadletters.db.")
    url: str | None = Field(
        None, description="Redis URL for type 'redis' (or ${env:NAME} / ${secret:BLOCK_NAME})."
    )
    block: str | None = Field(
        None, description="Instead of url: the name of a prefect-redis RedisDatabase block."
    )
    archive: Path | None = Field(
        None, description="Append-only JSONL archive; default <state_dir>/deadletters.jsonl."
    )
    archive_max_bytes: int = Field(
        defaults.DEADLETTER_ARCHIVE_BYTES,
        ge=1024,
        description="The archive is rotated to <name>.NNNNN.jsonl past this size (bytes).",
    )

    @model_validator(mode="after")
    def _backend_fields(self) -> Self:
        _check_backend_url("dead-letter store", self.type, self.url, self.block)
        return self


class LocksSettings(_Section):
    """The Prefect global concurrency limit ``source:<name>`` that keeps runs from overlapping."""

    source_lock: bool = Field(
        True, description="Hold source:<name> (limit 1) for a whole `run` (plan to account)."
    )
    on_busy: Literal["wait", "skip"] = Field(
        "wait",
        description="When another run holds the lock: wait up to wait_s, then exit with code 3 "
        "(wait); or end at once with exit code 0 and 'skipped' in the summary (skip).",
    )
    wait_s: float = Field(
        defaults.LOCK_WAIT_S, ge=0, description="How long `wait` waits for the lock (seconds)."
    )
    lease_s: float = Field(
        defaults.LOCK_LEASE_S,
        ge=60,
        le=86400,
        description="Lease of the lock, renewed by Prefect every 3/4 of it (Prefect's minimum "
        "is 60 s); a run that died is found sooner, by its heartbeat silent for 30 s.",
    )


def _sink_type(value: Any) -> str:
    """The sink's tag; ``type`` may be left out for the JSONL default."""
    if isinstance(value, dict):
        return str(value.get("type", "jsonl"))
    return str(getattr(value, "type", "jsonl"))


SinkSettings = Annotated[
    Annotated[JsonlSinkSettings, Tag("jsonl")] | Annotated[PostgresSinkSettings, Tag("postgres")],
    Discriminator(
        _sink_type,
        custom_error_type="sink_type",
        custom_error_message="type must be 'jsonl' or 'postgres'",
    ),
]


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
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    frontier: FrontierSettings = Field(default_factory=FrontierSettings)
    deadletters: DeadLetterSettings = Field(default_factory=DeadLetterSettings)
    locks: LocksSettings = Field(default_factory=LocksSettings)
    repair: RepairRules = Field(
        default_factory=RepairRules,
        description="Fixes triage may apply to quarantined records (collector.recovery.repair).",
    )
    backlog: BacklogSettings = Field(default_factory=BacklogSettings)
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
                for line in lines:
                    line = line.strip()
                    if line and not line.startswith("#"):
                        yield line
        if self.seeds.range is not None:
            yield from self.template_urls(*self.seeds.range)

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
        """Headers with ``${env:NAME}`` / ``${secret:NAME}`` replaced (see :meth:`resolve`)."""
        return {
            name: self.resolve_env(value, field=f"limits.headers.{name}")
            for name, value in self.limits.headers.items()
        }

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


def _format_location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in {"jsonl", "postgres"}:  # discriminator tags add noise to the path
            continue
        else:
            parts.append(("." if parts else "") + item)
    return "".join(parts) or "(top level)"


def _problems_from(exc: ValidationError, label: str) -> list[str]:
    lines = []
    for error in exc.errors():
        where = _format_location(tuple(error["loc"]))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key (check the spelling; `collector schema` lists every key)"
        elif error["type"] == "missing":
            message = "required key is missing"
        # A validator that finds several problems raises them one a line (TTL pairs, seed
        # URLs): each is a problem line of its own, at the same place.
        lines += [f"{label}: {where}: {line}" for line in message.splitlines() or [message]]
    return lines


def _capped(problems: list[str], label: str) -> list[str]:
    """At most MAX_PROBLEMS lines, in the order found, the last saying there are more: a file
    broken everywhere (a seed file of 10,000 bad lines) stays readable. Some checks stop looking
    past the cap, so that line does not count them."""
    if len(problems) <= MAX_PROBLEMS:
        return problems
    shown = MAX_PROBLEMS - 1
    return [
        *problems[:shown],
        f"{label}: more problems not shown (the first {shown} are above); fix these first",
    ]


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


def parse_source(data: Any, *, label: str, base_dir: Path) -> Source:
    """Check a parsed YAML/JSON document as a source; raise SourceError with every problem."""
    if not isinstance(data, dict):
        raise SourceError([f"{label}: the file must be a mapping of keys (name, seeds, ...)"])
    try:
        source = Source.model_validate({**data, "base_dir": base_dir})
    except ValidationError as exc:
        problems = _problems_from(exc, label)
        ttl = data.get("ttl")
        if isinstance(ttl, dict) and not any(": ttl: " in p for p in problems):
            # Field errors stop pydantic before the cross-field check; run it on the raw values
            # so every problem is reported at once.
            problems += [f"{label}: ttl: {problem}" for problem in alignment_problems(ttl)]
        raise SourceError(_capped(problems, label)) from None
    problems = _deep_checks(source, label)
    if problems:
        raise SourceError(_capped(problems, label))
    return source


def placeholder_seed_problem(url: str, label: str) -> str | None:
    """A seed on a ``.invalid`` host: a placeholder (``collector init`` writes
    ``https://example.invalid/...``; the name can never resolve, RFC 6761), so the run could only
    dead-letter it. Said with what to do, naming the file."""
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    if host != "invalid" and not host.endswith(".invalid"):
        return None
    return (
        f"{quoted(url)} is a placeholder (a .invalid host never resolves): "
        f"replace the placeholder seed URL in {label} with a page of the site to collect"
    )


# Seed-file lines a load checks: a typo in a hand-written file is caught before anything runs,
# while loading a catalogue of millions of lines stays cheap (~8 us a line); the plan checks every
# line it offers (a malformed one is a refused_url dead letter naming it), `collector validate`
# checks them all (seed_file_problems with first=None).
SEED_LINES_CHECKED = 10_000


def seed_file_problems(source: Source, label: str, *, first: int | None) -> list[str]:
    """Problems of the seed file's first ``first`` lines (every line with None), one line each."""
    if source.seeds.file is None:
        return []
    seed_file = source.path(source.seeds.file)
    if not seed_file.is_file():
        return [f"{label}: seeds.file: {seed_file} does not exist"]
    problems: list[str] = []
    try:
        with seed_file.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if first is not None and number > first:
                    break
                line = line.strip()
                if line and not line.startswith("#"):
                    reason = (
                        check_url_syntax(line)
                        or _placeholder_problem(line)
                        or placeholder_seed_problem(line, label)
                    )
                    if reason is not None:
                        problems.append(f"{label}: seeds.file line {number}: {reason}")
                        if len(problems) > MAX_PROBLEMS:
                            break
    except UnicodeDecodeError as exc:
        problems.append(f"{label}: seeds.file: {seed_file} is not UTF-8 text: {exc}")
    return problems


def _deep_checks(source: Source, label: str) -> list[str]:
    """Checks that need the file system or imports: seed file, suite, hooks."""
    problems: list[str] = []
    for index, url in enumerate(source.seeds.urls):
        placeholder = placeholder_seed_problem(url, label)
        if placeholder is not None:
            problems.append(f"{label}: seeds.urls[{index}]: {placeholder}")
    problems += seed_file_problems(source, label, first=SEED_LINES_CHECKED)
    if source.seeds.template is not None:
        sample = source.seeds.template.format(i=source.seeds.range[0] if source.seeds.range else 0)
        reason = check_url_syntax(sample) or placeholder_seed_problem(source.seeds.template, label)
        if reason is not None:
            problems.append(f"{label}: seeds.template: {reason}")
    if source.validation.suite is not None:
        from collector.settle.suite import suite_problems

        problems += _suite_problems(source, label, suite_problems)
    try:
        source.ttl.validate_hook()
    except ConfigError as exc:
        problems.append(f"{label}: {exc}")
    if source.record.parser != "json":
        from collector._hooks import resolve_callable

        try:
            resolve_callable(source.record.parser, field="record.parser")
        except ConfigError as exc:
            problems.append(f"{label}: {exc}")
    return problems


def _suite_problems(source: Source, label: str, check: Callable[[Path], list[str]]) -> list[str]:
    """``check``'s problems with the source's suite file, or with its inline suite written to a
    temporary file (checked without touching state_dir), one line each naming the field."""
    suite = source.validation.suite
    if isinstance(suite, dict):
        with tempfile.TemporaryDirectory() as folder:
            inline = write_inline_suite(suite, Path(folder) / "inline.json")
            # the temporary file's name would mean nothing to the user
            found = [line.replace(str(inline), "(inline suite)") for line in check(inline)]
    elif suite is not None:
        found = check(source.path(suite))
    else:
        found = []
    return [f"{label}: validation.suite: {line}" for line in found]


def suite_kwargs_problems(source: Source, label: str) -> list[str]:
    """The run's GX check of the suite's kwargs (a missing required ``column``...), for
    ``collector validate``: it imports GX (seconds), so only when the source has a suite, and
    not in :func:`parse_source`, which every run calls in a process meant to stay free of GX
    (collector.settle.suite.kwargs_problems). Every bad expectation, one line each."""
    if source.validation.suite is None:
        return []
    from collector.settle.suite import kwargs_problems

    return _capped(_suite_problems(source, label, kwargs_problems), label)


def load_source(path: str | os.PathLike[str]) -> Source:
    """Read and check a source file (YAML or JSON)."""
    file = Path(path)
    label = str(file)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SourceError([f"{label}: file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError([f"{label}: cannot read: {exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SourceError([f"{label}: invalid YAML: {where}{problem}"]) from None
    return parse_source(data, label=label, base_dir=file.resolve().parent)


_WARN_SEED_SAMPLE = 10_000  # seed URLs looked at by source_warnings (the plan checks them all)
_WARN_HOSTS = 20  # distinct hosts checked (each may cost a DNS lookup)


def source_warnings(source: Source) -> list[str]:
    """What is valid but will probably go wrong at run time, one line each.

    * a ``${env:NAME}`` whose variable is not set here (it may still be set where the run
      happens, so this is a warning, not a problem);
    * seed hosts the URL policy refuses (loopback or private addresses without
      ``allow_private_networks``, hosts outside ``allowed_hosts``): the run would dead-letter
      them at plan without fetching anything.
    """
    warnings: list[str] = []
    refs: list[tuple[str, str | None]] = [
        (f"limits.headers.{k}", v) for k, v in source.limits.headers.items()
    ]
    refs += [
        ("frontier.url", source.frontier.url),
        ("deadletters.url", source.deadletters.url),
        ("limits.rate_storage", source.limits.rate_storage),
    ]
    if isinstance(source.sink, PostgresSinkSettings):
        refs.append(("sink.dsn", source.sink.dsn))
    for field, value in refs:
        for name in _ENV_REF.findall(value or ""):
            if name not in os.environ:
                warnings.append(
                    f"{field}: environment variable {name} is not set here; "
                    "the run fails unless it is set where it runs"
                )
    refused = _refused_seeds(source)
    if refused is not None:
        count, sampled, reason = refused
        warnings.append(
            f"{count} of the first {sampled} seed URLs would be refused before fetching: {reason}"
        )
    return warnings


def _refused_seeds(source: Source) -> tuple[int, int, str] | None:
    """(refused, sampled, first reason) over a sample of the seeds, or None if none refused."""
    from collector.errors import RecoverableFetchError
    from collector.policy.urls import HostPolicy
    from collector.run.seeds import SeedCheck

    # The plan's own check (SeedCheck), so validate warns about exactly what a run refuses; the
    # verdict is per URL (a URL with credentials is refused on a host others are fine on), the
    # DNS lookups per host (the policy caches them; unresolvable hosts are skipped here).
    check = SeedCheck(
        HostPolicy(
            allow_private_networks=source.allow_private_networks,
            allowed_hosts=source.limits.allowed_hosts,
        )
    )
    hosts: set[str] = set()
    unresolved: set[str] = set()
    refused = sampled = 0
    first: str | None = None
    try:
        for sampled, url in enumerate(source.iter_seed_urls(), 1):
            host = (urlsplit(url).hostname or "").lower()
            if host not in hosts:
                if len(hosts) >= _WARN_HOSTS:
                    sampled -= 1
                    break
                hosts.add(host)
            reason = None
            if host not in unresolved:
                try:
                    reason = check.refusal(url)
                except RecoverableFetchError:
                    unresolved.add(host)  # DNS may work at run time
            if reason is not None:
                refused += 1
                first = first or reason
            if sampled >= _WARN_SEED_SAMPLE:
                break
    except (OSError, ValueError):
        return None  # an unreadable seed file is a problem reported elsewhere
    return None if first is None else (refused, sampled, first)


def source_json_schema() -> dict[str, Any]:
    """The JSON schema of a source file (what `collector schema` prints)."""
    schema = Source.model_json_schema(by_alias=True)
    schema.get("properties", {}).pop("base_dir", None)
    return schema
