"""A batch's tail: retries waiting inline go back to the queue once nothing else is left.

A short retry delay (``retry.max_inline_delay_s``, a ``Retry-After: 1`` among them) is waited
inside the batch, beside the batch's other requests, so the item needs no second claim. But the
run claims its next batch only when this one has returned: once every other item is done, the
batch's last retries sleep alone and the run fetches nothing. On a token-bucket host whose 429s
carry ``Retry-After: 1``, every batch ended in a second of such sleep, and the run reached 0.58x
the bucket's rate (0.14x with a fixed window).

So a batch keeps count of its items that have work besides waiting out a delay (fetching,
waiting for a slot or a pacing time); when that count falls to zero, each item still waiting
with at least ``MIN_HANDBACK_S`` left is handed back ``later``, due when its wait would have
ended (the frontier's not-before time), and the run goes on to the next batch. The wait is not
shortened: the item is not asked again before its time. A shorter remainder is slept out, since a
second claim would cost more.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["MIN_HANDBACK_S", "BatchTail"]

MIN_HANDBACK_S = 0.2  # a wait shorter than this is slept out, not handed back


class BatchTail:
    """Counts a batch's items still working; wakes its waiters when none is."""

    def __init__(self, items: int) -> None:
        self.working = items
        self.waiting = 0
        self._idle = asyncio.Event()

    def finished(self) -> None:
        """One item is done (whatever its result)."""
        self.working -= 1
        self._judge()

    async def wait_out(self, delay_s: float) -> float:
        """Wait ``delay_s``, or less if the batch has nothing but waits left: the seconds still
        to wait then (the item goes back to the queue for them), or 0.0 when waited out."""
        loop = asyncio.get_running_loop()
        until = loop.time() + delay_s
        self.working -= 1
        self.waiting += 1
        self._judge()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), delay_s)
            left = until - loop.time()
            if left < MIN_HANDBACK_S:
                await asyncio.sleep(max(left, 0.0))
                return 0.0
            return left
        finally:
            self.waiting -= 1
            self.working += 1
            self._judge()

    def _judge(self) -> None:
        if self.working <= 0 and self.waiting > 0:
            self._idle.set()
        else:
            self._idle.clear()
