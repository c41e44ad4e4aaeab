"""Resolve ``package.module:attribute`` (or ``package.module.attribute``) strings to objects.

Sources name user code (custom parsers, freshness hooks) by dotted path so that a YAML file can
point at it; resolution errors become one-line ``ConfigError``s naming the field.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from collector.errors import ConfigError

__all__ = ["resolve_callable"]


def resolve_callable(path: str, *, field: str) -> Callable[..., Any]:
    """Import ``path`` and return the callable it names, or raise ConfigError for ``field``."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{field}: {path!r} is not a dotted path like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{field}: cannot import module {module_name!r}: {exc}") from exc
    try:
        obj: object = getattr(module, attr)
    except AttributeError as exc:
        raise ConfigError(f"{field}: module {module_name!r} has no attribute {attr!r}") from exc
    if not callable(obj):
        raise ConfigError(f"{field}: {path!r} is not callable")
    return obj
