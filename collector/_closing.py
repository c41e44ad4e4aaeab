"""``with backend as b: ...``: every backend (frontier, sink, dead letters) closes on exit.

One mixin instead of the same two methods in each class; the backend's own ``close()`` does
the work, so leaving the block by an exception closes it too.
"""

from __future__ import annotations

from typing import Self

__all__ = ["Closing"]


class Closing:
    """Context-manager methods over the class's ``close()``."""

    def close(self) -> None:  # pragma: no cover - every backend defines its own
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
