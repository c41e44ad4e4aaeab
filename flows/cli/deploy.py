"""``collector deploy SOURCE... | --dir DIR``: one Prefect deployment per source; and
``collector fleet``: the autoscaler of their helpers, run in this process.

Every source is loaded and checked first (an invalid one: its problems, exit 2, nothing
written); then each gets ``collect/source-<name>`` on the pool (created or updated: running it
again changes the same deployments). Prints one line per source: what was written, its queue and
its schedule. docs/fleet.md says what the deployments do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from collector import defaults
from collector.errors import CollectorError, ConfigError
from flows.cli._common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    SOURCE_HELP,
    _prefect_environment,
    _prefect_server,
    add_json,
    load,
    positive_int,
)

SOURCE_SUFFIXES = (".yaml", ".yml", ".json")
COMPANIONS = (".suite.json", ".deployment.yaml")
"""The files ``collector init`` writes beside a source (its GX suite, its deployment entry):
not sources, so ``--dir`` over the folder init wrote skips them instead of refusing them."""
WARM_BY_DEFAULT = True  # runs start warm unless --cold-start (docs/workers.md "Warm starts")


def references(args: argparse.Namespace) -> list[str]:
    """The sources named: the arguments, then the source files of ``--dir`` (sorted)."""
    found = list(args.sources)
    if args.dir is not None:
        folder = Path(args.dir)
        if not folder.is_dir():
            raise ConfigError(f"--dir {args.dir}: not a folder")
        found += sorted(
            str(path) for path in folder.iterdir()
            if path.suffix in SOURCE_SUFFIXES and not path.name.endswith(COMPANIONS)
            and path.is_file()
        )  # fmt: skip
    if not found:
        raise ConfigError("name at least one SOURCE, or --dir DIR with source files in it")
    return found


def cmd_deploy(args: argparse.Namespace) -> int:
    from collector.fleet.deploy import plan_for
    from flows.deploy import portable_warm_command, warm_command
    from flows.sources import source_reference

    _prefect_environment()
    warm = WARM_BY_DEFAULT if args.start is None else args.start == "warm"
    try:
        # named interpreter: exactly it; none: the deploying one, else python3/python there
        exact = args.worker_python is not None
        command = None
        if warm:
            command = warm_command(args.worker_python) if exact else portable_warm_command()
    except ConfigError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_INVALID
    plans = []
    seen: dict[str, str] = {}
    for reference in references(args):
        source = load(reference)  # an invalid source: its problems, exit 2 (main)
        if source.name in seen:
            print(
                f"collector: {reference}: source name {source.name!r} is also the name of "
                f"{seen[source.name]}; each deployment needs its own name",
                file=sys.stderr,
            )
            return EXIT_INVALID
        seen[source.name] = reference
        plans.append(plan_for(source, source_reference(reference), batch_size=args.batch_size,
                              command=command))  # fmt: skip
    _prefect_server()
    from flows.deploy import deploy_plans

    try:
        written = asyncio.run(deploy_plans(plans, pool=args.pool))
    except ConfigError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for item in written:
        plan = item.plan
        if args.json:
            print(json.dumps({
                "source": plan.source, "deployment": f"collect/{plan.name}",
                "id": str(item.deployment_id), "updated": item.updated,
                "queue": plan.work_queue, "schedule": plan.schedule_text(),
                "parameters": plan.parameters, "command": plan.command,
            }))  # fmt: skip
        else:
            verb = "updated" if item.updated else "created"
            print(f"{verb}  collect/{plan.name}  queue {plan.work_queue}  "
                  f"{plan.schedule_text()}  source {plan.reference}")  # fmt: skip
    if not args.json and written:
        if command is None:
            print("runs start cold (python -m prefect.engine on the worker's interpreter)")
        elif exact:
            print(f"runs start warm: the workers run `{command}`, so that interpreter must exist "
                  "at that path, with Collector installed, on every worker machine (else "
                  "--cold-start)")  # fmt: skip
        else:
            print(f"runs start warm: the workers run `{sys.executable} -m flows.warmstart` "
                  "where that path exists, else python3 or python on their PATH, which must "
                  "have Collector installed (--worker-python PATH names one exactly; "
                  "--cold-start)")  # fmt: skip
    return EXIT_OK


def cmd_fleet(args: argparse.Namespace) -> int:
    """Run the ``fleet`` flow here until ``--duration`` (or drained, with ``--until-idle``)."""
    _prefect_environment()
    _prefect_server()
    from flows.fleet import fleet

    try:
        tally = asyncio.run(
            fleet(  # the flow is async: a coroutine
                budget=args.budget,
                duration_s=args.duration,
                pool=args.pool,
                stop_when_idle_s=args.until_idle,
            )
        )
    except CollectorError as exc:
        print(f"collector: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("collector: fleet stopped; the helpers it started end when drained", file=sys.stderr)
        raise
    print(json.dumps(tally) if args.json else
          "fleet: {rounds} rounds, {started} helpers started, {stopped} stopped ({preempted} "
          "preempted), at most {most_helpers} at once".format(**tally))  # fmt: skip
    return EXIT_OK


def register(commands: Any) -> None:
    """Add this group's subcommands to ``collector``'s parser."""
    deploy = commands.add_parser(
        "deploy", help="write one Prefect deployment per source (its schedule, queue, trigger)"
    )
    deploy.add_argument("sources", nargs="*", metavar="SOURCE", help=SOURCE_HELP)
    deploy.add_argument(
        "--dir", default=None, metavar="DIR",
        help="also every source file (*.yaml, *.yml, *.json) directly in DIR (not the"
        " *.suite.json and *.deployment.yaml files `collector init` writes beside them)",
    )  # fmt: skip
    deploy.add_argument(
        "--pool", default=defaults.FLEET_POOL, metavar="NAME",
        help=f"the work pool (default {defaults.FLEET_POOL}; infra/bootstrap creates it)",
    )  # fmt: skip
    deploy.add_argument(
        "--batch-size", type=positive_int, default=defaults.BATCH_SIZE, metavar="N",
        help=f"items per task in the deployed runs (default {defaults.BATCH_SIZE})",
    )  # fmt: skip
    start = deploy.add_mutually_exclusive_group()
    start.add_argument(
        "--warm-start", dest="start", action="store_const", const="warm", default=None,
        help="start each run's process as a fork of a pre-started interpreter on the worker "
        "(the workers' command `PYTHON -m flows.warmstart`; docs/workers.md)"
        + (" (the default)" if WARM_BY_DEFAULT else ""),
    )  # fmt: skip
    start.add_argument(
        "--cold-start", dest="start", action="store_const", const="cold",
        help="start each run as a new `python -m prefect.engine` (Prefect's own way)"
        + ("" if WARM_BY_DEFAULT else " (the default)"),
    )  # fmt: skip
    deploy.add_argument(
        "--worker-python", default=None, metavar="PATH",
        help="the interpreter the workers run for a warm start, exactly (default: the one "
        "running `collector deploy` where it exists on the worker, else python3 or python on "
        "the worker's PATH)",
    )  # fmt: skip
    add_json(deploy, "one line per deployment written")
    deploy.set_defaults(func=cmd_deploy)

    fleet = commands.add_parser(
        "fleet", help="start/stop helpers of the deployed sources by priority and load, here"
    )
    fleet.add_argument(
        "--budget", type=int, default=defaults.FLEET_BUDGET, metavar="N",
        help=f"helpers at once across all sources (default {defaults.FLEET_BUDGET})",
    )  # fmt: skip
    fleet.add_argument(
        "--duration", type=float, default=3600.0, metavar="SECONDS",
        help="how long to keep scaling (default 3600)",
    )  # fmt: skip
    fleet.add_argument(
        "--until-idle", type=float, default=None, metavar="SECONDS",
        help="end sooner, once every source was drained, helper-free and without a live "
        "run of its own this long",
    )  # fmt: skip
    fleet.add_argument(
        "--pool", default=defaults.FLEET_POOL, metavar="NAME",
        help=f"the work pool of the deployed sources (default {defaults.FLEET_POOL})",
    )  # fmt: skip
    add_json(fleet, "the tallies")
    fleet.set_defaults(func=cmd_fleet)
