"""Checks deeper than the model: seed files, placeholder seeds, the suite, unset variables,
Redis URLs, and the warnings of a valid source (refused seeds, hosts that do not resolve)."""

from __future__ import annotations

import ipaddress
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from collector import defaults
from collector._text import quoted
from collector.config.problems import MORE_NOT_SHOWN
from collector.config.sections import (
    _ENV_REF,
    _REDIS_SCHEMES,
    _REF,
    MAX_PROBLEMS,
    PostgresSinkSettings,
    _placeholder_problem,
)
from collector.config.source import Source, write_inline_suite
from collector.errors import ConfigError
from collector.policy.urls import check_url_syntax


def _capped(problems: list[str], label: str) -> list[str]:
    """At most MAX_PROBLEMS lines, in the order found, the last saying there are more: a file
    broken everywhere (a seed file of 10,000 bad lines) stays readable. Some checks stop looking
    past the cap, so that line does not count them."""
    if len(problems) <= MAX_PROBLEMS:
        return problems
    shown = MAX_PROBLEMS - 1
    return [
        *problems[:shown],
        f"{label}: {MORE_NOT_SHOWN} (the first {shown} are above); fix these first",
    ]


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


# Fields where ${env:NAME} / ${secret:NAME} are replaced (Source.resolve's callers), and those
# whose own validator already says they are not (seeds, user_agent) or that are free text.
_RESOLVED_FIELDS = ("limits.headers.", "limits.rate_storage", "frontier.url", "deadletters.url",
                    "sink.dsn")  # fmt: skip
_NOT_WALKED = ("seeds", "politeness.user_agent", "description", "validation")


def unresolved_references(data: Any, path: str = "") -> list[str]:
    """``KEY: ...`` for each ``${env:}`` / ``${secret:}`` in a field that does not resolve them:
    the text would be used as written (a sink folder named ``${env:OUT}``), without a word."""
    if path.startswith(_NOT_WALKED) or path.startswith(_RESOLVED_FIELDS):
        return []
    if isinstance(data, dict):
        return [
            problem
            for key, value in data.items()
            for problem in unresolved_references(value, f"{path}.{key}" if path else str(key))
        ]
    if isinstance(data, list):
        return [
            p for i, value in enumerate(data) for p in unresolved_references(value, f"{path}[{i}]")
        ]
    found = _REF.search(data) if isinstance(data, str) else None
    if found is None:
        return []
    return [
        f"{path}: {found.group(0)} is not resolved here and would be used as written "
        "(${env:} and ${secret:} work only in limits.headers, limits.rate_storage, frontier.url, "
        "deadletters.url and sink.dsn)"
    ]


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
    problems += _retry_profile_problems(source, label)
    return problems


def _retry_profile_problems(source: Source, label: str) -> list[str]:
    """A profile whose max_duration_s is shorter than one request deadline: its first retry
    could never be scheduled after a timed-out attempt."""
    deadline = source.ttl.request_deadline_s
    return [
        f"{label}: retry.profiles.{name}: max_duration_s ({duration:g}) is shorter than one "
        f"request deadline (ttl.request_deadline_s = {deadline:g})"
        for name, profile in source.retry.profiles.items()
        if (duration := profile.max_duration_s) is not None and duration < deadline
    ]


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


_WARN_SEED_SAMPLE = 10_000  # seed URLs looked at by source_warnings (the plan checks them all)
_WARN_HOSTS = 20  # distinct hosts checked (each may cost a DNS lookup)


def source_warnings(source: Source) -> list[str]:
    """What is valid but will probably go wrong at run time, one line each.

    * a ``${env:NAME}`` whose variable is not set here (it may still be set where the run
      happens, so this is a warning, not a problem);
    * seed hosts the URL policy refuses (loopback or private addresses without
      ``allow_private_networks``, hosts outside ``allowed_hosts``): the run would dead-letter
      them at plan without fetching anything;
    * a public host would get a User-Agent that names no one to contact (Collector's own,
      while ``politeness.user_agent`` is unset, or one without a URL or an email);
    * a queue TTL shorter than the per-host rate needs to fetch the seeds of one host: the
      rest would expire in the queue unfetched, run after run;
    * a ``retry.max_retry_after_s`` set above every retry window (``max_total_s``, a profile's
      ``max_duration_s``): a Retry-After that long ends the page, it is never waited.
    """
    warnings = [
        f"{problem} here; the run fails unless it is set where it runs"
        for problem in unset_variables(source)
    ]
    refused = _refused_seeds(source)
    if refused is not None:
        count, sampled, reason = refused
        warnings.append(
            f"{count} of the first {sampled} seed URLs would be refused before fetching: {reason}"
        )
    warnings += user_agent_warnings(source)
    warnings += queue_ttl_warnings(source)
    warnings += retry_after_warnings(source)
    return warnings


def retry_after_warnings(source: Source) -> list[str]:
    """``retry.max_retry_after_s``, set by the user, above the longest retry window.

    No retry is scheduled past ``max_total_s`` (a profile's ``max_duration_s``) after the first
    attempt, so a Retry-After longer than that window dead-letters the page at once
    (``max_total_exceeded``), whatever the clamp: a clamp above every window promises waits that
    never happen. The defaults (3600 above 900) are not warned about: the clamp is the ceiling
    for a profile given a longer window (an hour's reconciliation export), and a user who only
    shortened a window asked to give up sooner. Without ``respect_retry_after`` there is
    nothing to wait.
    """
    retry = source.retry
    if "max_retry_after_s" not in retry.model_fields_set or not retry.respect_retry_after:
        return []
    windows = {"retry.max_total_s": retry.max_total_s}
    windows |= {f"retry.profiles.{name}": retry.named(name).max_total_s for name in retry.profiles}
    longest, window = max(windows.items(), key=lambda named: named[1])
    clamp = retry.max_retry_after_s
    if clamp <= window:
        return []
    field = longest if longest == "retry.max_total_s" else f"{longest}'s max_duration_s"
    return [
        f"retry.max_retry_after_s ({clamp:g} s) is above {field} ({window:g} s), the longest "
        f"retry window: a Retry-After over {window:g} s ends the page at once as a dead letter "
        f"(max_total_exceeded), never waited; raise the window to {clamp:g} s to wait that long, "
        f"or lower max_retry_after_s below {window:g} s to retry sooner than such a server asks"
    ]


def queue_ttl_warnings(source: Source) -> list[str]:
    """``ttl.queue_ttl_s`` below the time ``limits.per_domain_rate`` needs for the busiest
    host's seeds (among the first ``_WARN_SEED_SAMPLE``): pages still queued past the TTL are
    counted expired and planned again by the next run, which expires them again the same way,
    so some are never fetched while every run balances and exits 0."""
    rate = source.limits.per_domain_rate
    if rate is None:
        return []
    from limits import parse

    item = parse(rate)
    per_s = item.amount / item.get_expiry()
    try:
        hosts = Counter(
            urlsplit(url).hostname or ""
            for url in islice(source.iter_seed_urls(), _WARN_SEED_SAMPLE)
        )
    except (OSError, ValueError):
        return []  # an unreadable seed file is a problem reported elsewhere
    if not hosts:
        return []
    host, count = hosts.most_common(1)[0]
    needed_s = count / per_s
    queue_ttl_s = source.ttl.queue_ttl_s
    if queue_ttl_s >= needed_s:
        return []
    return [
        f"ttl.queue_ttl_s ({queue_ttl_s:g} s) is shorter than the {needed_s:.0f} s that "
        f"{count} seed URLs of {host} take at limits.per_domain_rate {rate!r}: pages queued "
        "longer expire unfetched, and each run plans them again; raise queue_ttl_s or the rate"
    ]


_CONTACT = re.compile(r"https?://[^\s;)]+|[\w.+-]+@[\w-]+(\.[\w-]+)+")
# Names that are never a public site's (RFC 6761 and 6762, RFC 8375, example.com and friends).
_NOT_PUBLIC = (".localhost", ".local", ".internal", ".invalid", ".test", ".example", ".home.arpa")
_EXAMPLE_DOMAINS = ("example.com", "example.net", "example.org")
_UA_HOSTS_SAMPLE = 1_000  # seed URLs looked at for a public host
_UA_EXAMPLE = "acme-prices/1.0 (+https://acme.example/bot; ops@acme.example)"


def _public(host: str) -> bool:
    """Whether ``host`` is a site on the internet (not this machine, a private network, or a
    name reserved for tests and examples). Names are not resolved."""
    host = host.lower().rstrip(".")
    if not host or host == "localhost" or host.endswith(_NOT_PUBLIC):
        return False
    if host in _EXAMPLE_DOMAINS or host.endswith(tuple(f".{d}" for d in _EXAMPLE_DOMAINS)):
        return False
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return True
    return address.is_global


def _public_seed_host(source: Source) -> str | None:
    """The first public host among the first seed URLs, or None."""
    try:
        for n, url in enumerate(source.iter_seed_urls()):
            host = urlsplit(url).hostname or ""
            if _public(host):
                return host
            if n >= _UA_HOSTS_SAMPLE:
                break
    except (OSError, ValueError):
        return None  # an unreadable seed file is a problem reported elsewhere
    return None


def has_contact(text: str) -> bool:
    """Whether ``text`` holds a URL or an email address (someone a site's operator can reach)."""
    return _CONTACT.search(text) is not None


def user_agent_warnings(source: Source) -> list[str]:
    """A User-Agent that names no one to contact, while a public host would get it: a site's
    operator who sees the requests cannot say who to ask (or block) instead of the network."""
    header = source.user_agent_header
    written = header[1] if header is not None else None
    if written is not None and "${secret:" in written:
        return []  # its Secret block is loaded by a run, never by a check
    try:
        agent = source.user_agent  # what the requests carry: ${env:...} resolved
    except ConfigError:
        return []  # its variable is not set here: unset_variables says so
    named = written is not None or agent != defaults.USER_AGENT
    if named and has_contact(agent):
        return []
    host = _public_seed_host(source)
    if host is None:
        return []
    if not named:
        return [
            f"politeness.user_agent is not set: requests to {host} say {agent!r}, Collector's "
            "own, which names no one the site can reach; set it to your crawler and a contact, "
            f"e.g. user_agent: {_UA_EXAMPLE!r}"
        ]
    sent = repr(agent) if written in (None, agent) else f"{written!r} ({agent!r} here)"
    return [
        f"the User-Agent {sent} sent to {host} names no contact: add a URL or an email, e.g. "
        f"{_UA_EXAMPLE!r}"
    ]


def unset_variables(source: Source) -> list[str]:
    """Every ``${env:NAME}`` of the fields that take them whose variable is not set, one line
    each (``FIELD: environment variable NAME is not set``): ``run`` refuses with all of them at
    once, ``validate`` warns."""
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
    return [
        f"{field}: environment variable {name} is not set"
        for field, value in refs
        for name in _ENV_REF.findall(value or "")
        if name not in os.environ
    ]


def redis_url_checked(url: str, *, field: str) -> str:
    """A resolved Redis URL (from ``${env:}``/``${secret:}``), checked as a literal one is at
    load: the same refusal (a ConfigError, exit 2), showing the scheme only (the rest may hold
    a password)."""
    if not url.startswith(_REDIS_SCHEMES):
        got = f"{url.partition('://')[0]}://" if "://" in url else "no scheme"
        raise ConfigError(
            f"{field}: url must start with redis://, rediss:// or unix://, got {got} from its "
            "${env:}/${secret:} reference"
        )
    return url


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
