"""Prefect block types for Collector: configuration editable in the Prefect UI.

Blocks are configuration only: each hands plain values (a mapping, a URL string) to
``collector/``, which never imports Prefect or this package. Register the types once per Prefect
server with ``collector blocks register`` (or ``prefect block register -m blocks``).

- :class:`CollectorSource` -- a whole source (its YAML text), run by
  ``collect(source="block:<name>")``.
- :class:`CollectorBackends` -- where a source's frontier, dead letters and records live,
  attached to a ``CollectorSource`` (Redis URLs are secrets).
"""

from __future__ import annotations

from blocks.backends import CollectorBackends
from blocks.source import BLOCK_TYPES, CollectorSource, block_name_of, register_block_types

__all__ = [
    "BLOCK_TYPES",
    "CollectorBackends",
    "CollectorSource",
    "block_name_of",
    "register_block_types",
]
