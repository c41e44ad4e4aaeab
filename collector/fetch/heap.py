"""The process's start-up heap, kept out of the cyclic garbage collector while engines fetch.

A fetch loop allocates a few hundred container objects per page (httpx and aiohttp requests and
responses, headers, futures, tasks, results), and a batch's live ones (its tasks, results and
bodies) survive long enough to be promoted, so Python's oldest-generation collection runs every
~0.6 s of a run. Each of those walks the whole heap, and a run's heap is mostly what start-up
imported (Prefect, pydantic models, the source's settings): ~100-160 ms per collection, ~16 %
of `collector run`'s fetch loop at 2,000 pages/s (measured with ``gc.callbacks`` on
bench/throughput.py's source; docs/performance.md).

:func:`frozen` moves every object alive when the first engine opens into the permanent
generation (:func:`gc.freeze`), so later collections walk only what was made since; the last
engine to close gives them back (:func:`gc.unfreeze`), and a collection after that sees them
again. Nothing is freed later than it would be by reference counting; only cyclic garbage that
already existed when the engine opened waits for the engine to close.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["frozen", "open_engines", "thawed"]

_lock = threading.Lock()
_open = 0  # engines open in this process (each thread's loop may have its own)


def frozen() -> None:
    """An engine opens: the first one freezes the heap as it is."""
    global _open
    with _lock:
        _open += 1
        if _open == 1:
            gc.freeze()


def thawed() -> None:
    """An engine closes: the last one gives the frozen objects back to the collector."""
    global _open
    with _lock:
        _open -= 1
        if _open == 0:
            gc.unfreeze()


def open_engines() -> int:
    """How many engines hold the heap frozen now (tests)."""
    return _open
