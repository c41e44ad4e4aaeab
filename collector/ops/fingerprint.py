"""A source's fingerprint: what changed means for the ``source-changed`` trigger.

The fingerprint hashes the source *as loaded*, without the values that equal their defaults: the
checked model of what the file says, serialised with sorted keys. So reformatting, comments, key
order, or spelling out a default change nothing; a different value does; and a release of
Collector that adds a setting (or changes a default) does not make every source look changed,
which would start one run of each when it is installed. Files the source points to (the seed
list, the GX suite) are part of it by content, because changing them changes what a run does.
``${env:NAME}`` references are hashed as written, never resolved: no secret goes into the hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from collector.config import Source

__all__ = ["fingerprint", "fingerprinted"]


def _file_digest(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None  # loading already reported a missing file; the path itself is in the model


def fingerprinted(source: Source) -> dict[str, object]:
    """What the fingerprint hashes: the source's values other than defaults, and the digests
    of the files it names."""
    return {
        "source": source.model_dump(mode="json", by_alias=True, exclude_defaults=True),
        "seed_file": _file_digest(source.path(source.seeds.file) if source.seeds.file else None),
        "suite": _file_digest(source.suite_path),
    }


def fingerprint(source: Source) -> str:
    """``sha256:<hex>`` of the normalized source and the contents of the files it names."""
    document = fingerprinted(source)
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
