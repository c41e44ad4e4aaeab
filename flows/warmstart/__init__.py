"""Warm starts: a flow run's process forked from a pre-started interpreter (docs/workers.md).

A process worker starts every flow run with its deployment's ``command``. The command
``<python> -m flows.warmstart`` (what ``collector deploy`` writes unless ``--cold-start``) is the
*shim* (:mod:`flows.warmstart.shim`): a standard-library-only program that asks the *zygote*
(:mod:`flows.warmstart.zygote`: an interpreter that imported Prefect's engine and the collect
flow once, then waits on a unix socket) to fork the run, hands it its stdin/stdout/stderr,
forwards the worker's signals to it and exits with its exit code. No zygote, a stale one (the
code changed on disk) or any error: the shim starts a zygote for next time and ``exec``s
``python -m prefect.engine`` itself, the cold start exactly.

Why under ``flows/``: the zygote imports Prefect and ``flows.collect`` and refreshes Prefect's
settings in each fork, which is orchestration (``collector/`` never imports Prefect or
``flows/``). The shim sits beside it because the two speak one protocol
(:mod:`flows.warmstart.common`); ``flows/__init__.py`` and this file import nothing, so
``python -m flows.warmstart`` starts in tens of milliseconds.

Nothing is imported here on purpose: keep it that way (tests/test_warm_start.py checks).
"""
