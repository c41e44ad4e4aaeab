"""``CollectorSource``: a whole source kept on the Prefect server, editable in the UI.

The flow's ``source`` parameter names it as ``block:<name>`` or ``collector-source/<name>``
(the slug form the Prefect UI and ``prefect block ls`` show). The block hands the engine a plain
mapping, checked by the very same model as a YAML file (``collector.config.parse_source``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from prefect.blocks.core import Block
from pydantic import Field

from blocks.backends import LOGO_URL, CollectorBackends

BLOCK_PREFIXES = ("block:", "collector-source/")


def block_name_of(source: str) -> str | None:
    """The block name a ``source`` parameter refers to, or None when it is a file path."""
    for prefix in BLOCK_PREFIXES:
        if source.startswith(prefix):
            name = source[len(prefix) :].strip()
            return name or None
    return None


class CollectorSource(Block):
    """A Collector source (the content of a source YAML file) stored as a Prefect block.

    ``definition`` holds the same keys as a source file (``name``, ``seeds``, ``record``,
    ``sink``, ``ttl``, ...); the UI edits it as JSON. Relative paths in it (sink, state, seed
    file, suite) are taken relative to ``base_dir`` on the worker that runs the flow.

    Example:
        Store a source file as a block and run it by name:
        ```python
        from blocks import CollectorSource

        CollectorSource.from_file("sources/items.yaml").save("shop-items", overwrite=True)
        # then: collect(source="block:shop-items"), or in the UI: source = block:shop-items
        ```
    """

    _block_type_name = "Collector Source"
    _block_type_slug = "collector-source"
    _logo_url = LOGO_URL  # type: ignore[assignment]
    _description = "A Collector source: seeds, TTLs, priority, retries, validation and sink."

    definition: dict[str, Any] = Field(
        title="Source definition",
        description="The source's settings, the same keys as a source YAML file "
        "(`collector schema` prints them all).",
        examples=[
            {
                "name": "shop-items",
                "seeds": {"template": "https://shop.example/api/items/{i}.json", "range": [0, 100]},
                "record": {"key": "id"},
                "sink": {"type": "jsonl", "path": "out"},
            }
        ],
    )
    base_dir: str = Field(
        default=".",
        title="Base folder",
        description="Folder, on the worker, that relative paths in the definition are relative to.",
        examples=["/srv/collector/sources"],
    )
    backends: CollectorBackends | None = Field(
        default=None,
        title="Backends",
        description="Optional shared backends that replace the definition's frontier, dead "
        "letters, sink folder and state folder.",
    )

    def block_initialization(self) -> None:
        if not isinstance(self.definition.get("name"), str):
            raise ValueError("definition: needs a `name` (letters, digits, _ . -)")

    @classmethod
    def from_file(cls, path: str | Path, **fields: Any) -> CollectorSource:
        """A block holding a source file's content, relative paths kept relative to its folder."""
        file = Path(path)
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{file}: the file must be a mapping of keys (name, seeds, ...)")
        fields.setdefault("base_dir", str(file.resolve().parent))
        return cls(definition=data, **fields)

    def as_document(self) -> dict[str, Any]:
        """The source as plain values, backends applied, for ``collector.config.parse_source``."""
        document = dict(self.definition)
        overrides = self.backends.source_overrides() if self.backends is not None else {}
        for key, value in overrides.items():
            current = document.get(key)
            if isinstance(current, dict) and isinstance(value, dict):
                document[key] = {**current, **value}
            else:
                document[key] = value
        return document

    @property
    def base_path(self) -> Path:
        return Path(self.base_dir).expanduser().resolve()


# Every Collector block type (re-exported by the package; here so that registering them needs no
# import of the package from inside it).
BLOCK_TYPES = (CollectorBackends, CollectorSource)


def register_block_types() -> list[str]:
    """Register every Collector block type with the current Prefect API; returns their slugs.

    Idempotent: registering again updates the schemas in place.
    """
    for block_type in BLOCK_TYPES:
        block_type.register_type_and_schema(_sync=True)  # type: ignore[call-arg]
    return [block_type.get_block_type_slug() for block_type in BLOCK_TYPES]
