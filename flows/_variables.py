"""Names of the Prefect Variables the operating flows keep their state in.

Prefect Variable names allow only lowercase letters, digits, '-' and '_'; source names also
allow capitals and '.', so a name that had to change gets a short digest of the original to
stay unique (``Shop.Items`` and ``shop-items`` must not share a state).
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["variable_name"]

_UNSAFE = re.compile(r"[^a-z0-9_-]")


def variable_name(prefix: str, source: str) -> str:
    """``<prefix>-<source>`` made a valid Variable name (at most 255 characters)."""
    safe = _UNSAFE.sub("-", source.lower())
    if safe != source:
        safe += "-" + hashlib.sha256(source.encode()).hexdigest()[:8]
    return f"{prefix}-{safe}"[:255]
