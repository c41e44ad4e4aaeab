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

import typing

from collector import _lazy

if typing.TYPE_CHECKING:
    # Names beyond __all__ that callers import from here (the checks `collector validate` and
    # `collector init` run, their limits, the loader the blocks use) are re-exported as `X as X`.
    from collector.config.checks import SEED_LINES_CHECKED as SEED_LINES_CHECKED
    from collector.config.checks import placeholder_seed_problem as placeholder_seed_problem
    from collector.config.checks import redis_url_checked, source_warnings, unset_variables
    from collector.config.checks import seed_file_problems as seed_file_problems
    from collector.config.checks import suite_kwargs_problems as suite_kwargs_problems
    from collector.config.loading import load_source, source_json_schema
    from collector.config.loading import parse_source as parse_source
    from collector.config.problems import SourceError
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

# Where each public name lives: imported on first use, so `SourceError` (all the CLI needs to
# report a bad file) does not pay for the pydantic models (collector/_lazy.py).
_HOMES = {
    "AdaptiveSettings": "collector.config.sections",
    "BacklogSettings": "collector.ops.backlog",
    "CircuitSettings": "collector.config.sections",
    "DeadLetterSettings": "collector.config.sections",
    "FrontierSettings": "collector.config.sections",
    "JsonlSinkSettings": "collector.config.sections",
    "LimitsSettings": "collector.config.sections",
    "LocksSettings": "collector.config.sections",
    "MAX_PROBLEMS": "collector.config.sections",
    "MetricsSettings": "collector.config.sections",
    "PolitenessSettings": "collector.config.sections",
    "PostgresSinkSettings": "collector.config.sections",
    "RecordSettings": "collector.config.sections",
    "SEED_LINES_CHECKED": "collector.config.checks",
    "SeedSettings": "collector.config.sections",
    "SinkSettings": "collector.config.sections",
    "Source": "collector.config.source",
    "SourceError": "collector.config.problems",
    "ValidationSettings": "collector.config.sections",
    "load_source": "collector.config.loading",
    "parse_source": "collector.config.loading",
    "placeholder_seed_problem": "collector.config.checks",
    "redis_url_checked": "collector.config.checks",
    "seed_file_problems": "collector.config.checks",
    "source_json_schema": "collector.config.loading",
    "source_warnings": "collector.config.checks",
    "suite_kwargs_problems": "collector.config.checks",
    "unset_variables": "collector.config.checks",
    "write_inline_suite": "collector.config.source",
}
__getattr__, __dir__ = _lazy.lazy_exports(__name__, _HOMES, globals())

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
