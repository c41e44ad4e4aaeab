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

The package's modules, one idea each: ``sections`` (the models of a file's sections),
``source`` (the :class:`Source` model), ``loading`` (YAML in, :class:`SourceError` lines out)
and ``checks`` (checks deeper than the model, and warnings). Every public name is here.
"""

from __future__ import annotations

# Names beyond __all__ that callers import from here (the checks `collector validate` and
# `collector init` run, their limits, the loader the blocks use) are re-exported as `X as X`.
from collector.config.checks import SEED_LINES_CHECKED as SEED_LINES_CHECKED
from collector.config.checks import placeholder_seed_problem as placeholder_seed_problem
from collector.config.checks import redis_url_checked, source_warnings, unset_variables
from collector.config.checks import seed_file_problems as seed_file_problems
from collector.config.checks import suite_kwargs_problems as suite_kwargs_problems
from collector.config.loading import SourceError, load_source, source_json_schema
from collector.config.loading import parse_source as parse_source
from collector.config.sections import MAX_PROBLEMS as MAX_PROBLEMS
from collector.config.sections import (
    AdaptiveSettings,
    CircuitSettings,
    DeadLetterSettings,
    FrontierSettings,
    JsonlSinkSettings,
    LimitsSettings,
    PolitenessSettings,
    PostgresSinkSettings,
    RecordSettings,
    SeedSettings,
    ValidationSettings,
)
from collector.config.sections import LocksSettings as LocksSettings
from collector.config.sections import MetricsSettings as MetricsSettings
from collector.config.sections import SinkSettings as SinkSettings
from collector.config.source import Source
from collector.config.source import write_inline_suite as write_inline_suite
from collector.ops.backlog import BacklogSettings

__all__ = [
    "AdaptiveSettings",
    "BacklogSettings",
    "CircuitSettings",
    "DeadLetterSettings",
    "FrontierSettings",
    "JsonlSinkSettings",
    "LimitsSettings",
    "PolitenessSettings",
    "PostgresSinkSettings",
    "RecordSettings",
    "SeedSettings",
    "Source",
    "SourceError",
    "ValidationSettings",
    "load_source",
    "redis_url_checked",
    "source_json_schema",
    "source_warnings",
    "unset_variables",
]
