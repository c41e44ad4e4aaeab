"""SIGINT/SIGTERM recorded while the ``collector`` command still imports (:mod:`flows.command`).

``import flows.cli`` takes seconds (the engine, aiohttp, pydantic), and Prefect more. A run's
stop handlers (:class:`collector.run.stop.StopRequest`) cannot be installed before those
imports, and until they are a SIGINT does what the process inherited: a traceback, or nothing
at all in a shell's background job (``collector run src.yaml &`` starts with SIGINT ignored,
and Python leaves it ignored). So for the commands that run a flow (``run``, ``work``,
``demo``), the console script calls :func:`catch_early` first, and this stdlib-only module
records SIGINT/SIGTERM; the command hands the first one to the run's stop request as it installs
its own handlers (:func:`flows.cli.running._run`), and the run stops gracefully as if the signal
came then. A second signal before that exits at once (nothing was claimed yet).

Apart from :mod:`flows.command` (the entry, which imports the whole CLI), so that the CLI reads
what was recorded without importing its own entry.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

__all__ = ["catch_early", "hand_over", "restore"]

_RUNS = frozenset({"run", "work", "demo"})  # the commands that run a flow
_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Process-wide: signal handlers are, and these hold what arrived before a run existed.
_caught: list[str] = []
_inherited: dict[signal.Signals, object] = {}  # the handlers the process started with


def _record(signum: int, frame: FrameType | None) -> None:
    if _caught:  # the second one: the user will not wait
        os.write(2, b"collector: stopped at once, before the run started\n")
        os._exit(128 + signum)
    _caught.append(signal.Signals(signum).name)


def catch_early(argv: list[str]) -> bool:
    """Record SIGINT/SIGTERM from now on when ``argv`` runs a flow; whether it does."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    if command not in _RUNS or threading.current_thread() is not threading.main_thread():
        return False
    for sig in _SIGNALS:
        _inherited[sig] = signal.signal(sig, _record)
    return True


def hand_over() -> str | None:
    """The first signal recorded so far, if any; the run's own handlers take over from here.

    Call it with those handlers installed (so no signal falls between the two), and
    :func:`restore` once they are removed.
    """
    return _caught[0] if _caught else None


def restore() -> None:
    """Put back the handlers the process started with (after the run: a Ctrl-C while the
    summary prints does what it did before)."""
    for sig, handler in _inherited.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]  # what signal.signal returned
    _inherited.clear()
