"""The ``collector`` console script's entry: stops asked for while the command still imports.

``import flows.cli`` takes seconds (the engine, aiohttp, pydantic), and Prefect more, so the
first thing :func:`main` does for the commands that run a flow is to have
:mod:`flows.early_signals` record SIGINT/SIGTERM (it says why and how they reach the run);
only then does it import the CLI.
"""

from __future__ import annotations

import sys

from flows.early_signals import catch_early

__all__ = ["main"]


def main() -> int:
    catch_early(sys.argv[1:])
    from flows.cli import main as command

    return command()


if __name__ == "__main__":
    raise SystemExit(main())
