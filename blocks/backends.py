"""``CollectorBackends``: where a source keeps its frontier, dead letters and records."""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

# Prefect's own storage logo (the UI shows a generic icon when it cannot load it offline).
LOGO_URL = (
    "https://cdn.sanity.io/images/3ugk85nk/production/"
    "dfb02cfce09ce3ca88fea097659a83554dd7a850-596x596.png"
)


class CollectorBackends(Block):
    """Backends for one or more sources, kept apart from the source so they can be shared.

    Values left empty keep what the source itself says (the embedded SQLite defaults). Redis
    URLs may carry a password, so they are secrets: the UI masks them and logs never show them.

    Example:
        Attach shared Redis backends to a source block:
        ```python
        from blocks import CollectorBackends, CollectorSource

        backends = CollectorBackends(
            frontier_redis_url="redis://:pw@redis:6379/0",
            deadletters_redis_url="redis://:pw@redis:6379/0",
            sink_path="/data/out",
        )
        backends.save("shared-redis", overwrite=True)
        CollectorSource(definition=open("items.yaml").read(), backends=backends).save(
            "shop-items", overwrite=True
        )
        ```
    """

    _block_type_name = "Collector Backends"
    _block_type_slug = "collector-backends"
    _logo_url = LOGO_URL  # type: ignore[assignment]
    _description = "Frontier, dead-letter and sink locations for Collector sources."

    frontier_redis_url: SecretStr | None = Field(
        default=None,
        title="Frontier Redis URL",
        description="redis:// URL of the shared frontier; empty keeps the source's own frontier.",
        examples=["redis://:password@redis:6379/0"],
    )
    deadletters_redis_url: SecretStr | None = Field(
        default=None,
        title="Dead letters Redis URL",
        description="redis:// URL of the shared dead-letter store; empty keeps the source's own.",
        examples=["redis://:password@redis:6379/0"],
    )
    sink_path: str | None = Field(
        default=None,
        title="Records folder",
        description="Folder for the JSONL records; empty keeps the source's `sink.path`.",
        examples=["/data/collector/out"],
    )
    state_dir: str | None = Field(
        default=None,
        title="State folder",
        description="Folder for the embedded frontier and dead letters; empty keeps the source's.",
        examples=["/data/collector/state"],
    )

    def block_initialization(self) -> None:
        for name in ("frontier_redis_url", "deadletters_redis_url"):
            value = getattr(self, name)
            if value is not None and not value.get_secret_value().startswith(
                ("redis://", "rediss://", "unix://")
            ):
                raise ValueError(f"{name}: must be a redis://, rediss:// or unix:// URL")

    def source_overrides(self) -> dict[str, Any]:
        """The source settings this block replaces, as plain values (secrets revealed)."""
        overrides: dict[str, Any] = {}
        if self.frontier_redis_url is not None:
            overrides["frontier"] = {
                "type": "redis", "url": self.frontier_redis_url.get_secret_value()
            }  # fmt: skip
        if self.deadletters_redis_url is not None:
            overrides["deadletters"] = {
                "type": "redis", "url": self.deadletters_redis_url.get_secret_value()
            }  # fmt: skip
        if self.sink_path:
            overrides["sink"] = {"path": self.sink_path}
        if self.state_dir:
            overrides["state_dir"] = self.state_dir
        return overrides
