"""A source's fingerprint: what changed means for the ``source-changed`` trigger.

The fingerprint hashes the source *as loaded*: the checked model with every default filled in,
serialised with sorted keys. So reformatting, comments, key order, or spelling out a default
change nothing; a different value does. Files the source points to (the seed list, the GX suite)
are part of it by content, because changing them changes what a run does. ``${env:NAME}``
references are hashed as written, never resolved: no secret goes into the hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from collector.config import Source

__all__ = ["fingerprint"]


def _file_digest(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # loading already reported a missing file; the path itself is in the model


def fingerprint(source: Source) -> str:
    """``sha256:<hex>`` of the normalized source and the contents of the files it names."""
    document = {
        "source": source.model_dump(mode="json", by_alias=True),
        "seed_file": _file_digest(source.path(source.seeds.file) if source.seeds.file else None),
        "suite": _file_digest(source.suite_path),
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
