"""Re-exports that import their module on first use (PEP 562), so a package's public names cost
nothing until they are used.

``import collector.config`` ran every submodule of the engine (aiohttp, httpx, pydantic models)
before a command could print its ``--help``; a package that lists its names here imports only
the submodule a caller reaches for. Type checkers still see the real names: each package
repeats them under ``if TYPE_CHECKING:``, and a test checks the two lists agree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose public names live in the
    modules ``homes`` maps them to (``{"Source": "collector.config.source"}``).

    A name is imported once and then kept in the package's namespace, so later lookups are
    plain attribute reads.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
