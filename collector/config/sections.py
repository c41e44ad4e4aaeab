"""The sections of a source file (seeds, record, limits, sinks, stores, locks, metrics), as
frozen pydantic models, each field with its meaning; the problems a section finds on its own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from collector import defaults
from collector._text import quoted
from collector.policy.urls import check_url_syntax
from collector.sinks._names import DEFAULT_TABLE, check_table_name

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_SECRET_REF = re.compile(r"\$\{secret:([A-Za-z0-9][A-Za-z0-9_.-]*)\}")
_REF = re.compile(r"\$\{(env|secret):([A-Za-z0-9_.-]+)\}")
_REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
# Problem lines reported for one source at most (the last then says there are more): every
# problem at once, as long as that stays readable on one screen.
MAX_PROBLEMS = 20


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
            if _REF.search(self.template):
                raise ValueError(
                    f"template {quoted(self.template)}: ${{env:...}} and ${{secret:...}} are not "
                    "supported in seeds (only in limits.headers, frontier.url, deadletters.url, "
                    "limits.rate_storage and sink.dsn): write the URL itself, and put a "
                    "credential in a header"
                )
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

    @field_validator("key", "records_path")
    @classmethod
    def _dotted_path(cls, value: str | None) -> str | None:
        """A dotted path with an empty part (``data..items``, ``.id``, ``id.``) matches no
        document: every page would be dead-lettered ("not found") only once the run fetched it."""
        if value is not None:
            if not value.strip():
                raise ValueError("is empty: give a field name, or a dotted path (data.items)")
            parts = value.split(".")
            if any(not part for part in parts):
                fixed = ".".join(part for part in parts if part)
                hint = f" (did you mean {quoted(fixed)}?)" if fixed else ""
                raise ValueError(
                    f"{quoted(value)} has an empty part between dots: no document has one{hint}"
                )
        return value


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
        description="Window x this on timeouts, refused connections, 502 and 504.",
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


class PolitenessSettings(_Section):
    """What the fetcher asks of servers beyond the limits (docs/politeness.md)."""

    conditional: bool = Field(
        True,
        description="Send a page's ETag / Last-Modified back when fetching it again "
        "(If-None-Match / If-Modified-Since); a 304 keeps its stored records (not_modified).",
    )
    robots: Literal["obey", "ignore"] = Field(
        defaults.ROBOTS,  # type: ignore[arg-type]
        description="obey: each host's robots.txt (for the User-Agent sent) decides which pages "
        "are fetched (disallowed ones are dead letters with cause robots) and its Crawl-delay "
        "is a floor under the host's pace; ignore: never fetched.",
    )
    robots_ttl_s: float = Field(
        defaults.ROBOTS_TTL_S, gt=0, description="A host's robots.txt is kept this long (s)."
    )
    robots_unreachable_s: float = Field(
        defaults.ROBOTS_UNREACHABLE_S,
        gt=0,
        description="robots.txt answered 429 or 5xx: the host's pages wait this long (s).",
    )
    user_agent: str | None = Field(
        None,
        description="The User-Agent sent to every host and matched against its robots.txt: "
        "your crawler's name and a contact a site's operator can reach, e.g. "
        "'acme-prices/1.0 (+https://acme.example/bot; ops@acme.example)'. Unset: Collector's "
        "own, which names no one (`validate` warns while a public host would get it); a "
        "User-Agent in limits.headers takes precedence.",
    )

    @field_validator("user_agent")
    @classmethod
    def _one_header_line(cls, value: str | None) -> str | None:
        """A header value: one line of printable ASCII, not blank (httpx refuses the rest)."""
        if value is None:
            return None
        if not value.strip() or not all(" " <= ch <= "~" for ch in value):
            raise ValueError(
                "must be one line of printable ASCII naming the crawler and a contact, e.g. "
                "'acme-prices/1.0 (+https://acme.example/bot; ops@acme.example)'"
            )
        if _REF.search(value):  # it would be sent, and matched against robots.txt, as written
            raise ValueError(
                f"{quoted(value)}: ${{env:...}} and ${{secret:...}} are not resolved in "
                "user_agent: write the User-Agent itself, or set it as a header that takes "
                "them (limits.headers: {User-Agent: ...})"
            )
        return value.strip()


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


class MetricsSettings(_Section):
    """What the source's Prometheus series may name (collector/ops/metrics.py)."""

    hosts: int = Field(
        0,
        ge=0,
        le=defaults.METRICS_MAX_HOSTS,
        description="Hosts the `host` label of collector_requests_total names (the first N seen;"
        " the rest are 'other'); 0: none, every host is 'other' (hosts never become series).",
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
