"""A source's ``schedule:`` section: when Prefect runs it, and how many helpers it may get.

Read by ``collector deploy`` (flows/deploy.py), which writes it into the source's own
deployment as a Prefect schedule (cron or interval, with its timezone, active or not), and by
the autoscaler (``max_helpers``). A source without a schedule is still deployed: it runs when
asked (the UI, ``prefect deployment run``, its event trigger). The cron string is checked here
for shape only (five fields of the allowed characters); Prefect's own parser checks it fully
when the deployment is written, and its refusal is one line naming the source.
"""

from __future__ import annotations

import re
import zoneinfo
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from collector import defaults
from collector.fleet.model import ScalingRules

__all__ = ["ScheduleSettings"]

_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,?LW#-]+")


class ScheduleSettings(BaseModel):
    """The ``schedule:`` section of a source (all optional)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cron: str | None = Field(
        None, description="A cron string (five fields), e.g. '*/15 * * * *'; or use interval_s."
    )
    interval_s: float | None = Field(
        None, gt=0, description="Seconds between runs; or use cron. Neither: runs on request only."
    )
    timezone: str = Field("UTC", description="IANA timezone of the cron string, e.g. Europe/Paris.")
    active: bool = Field(
        True, description="Whether the schedule makes runs (false: written, paused in the UI)."
    )
    max_helpers: int = Field(
        defaults.FLEET_MAX_HELPERS,
        ge=0,
        le=1000,
        description="Most `collector work` helpers the autoscaler gives this source (0: none).",
    )

    min_helpers: int = Field(
        defaults.FLEET_MIN_HELPERS,
        ge=0,
        le=1000,
        description="Fewest helpers the source keeps while items are due (the seeds' minSize; "
        "at most max_helpers).",
    )
    scale_factor: float = Field(
        defaults.FLEET_SCALE_FACTOR,
        gt=1,
        le=10,
        description="A step up is ceil(helpers x this), at least one more (busy held); a step "
        "down is floor(helpers / this) (idle or memory held).",
    )
    depth_share: float = Field(
        defaults.FLEET_DEPTH_SHARE,
        gt=0,
        le=1,
        description="Pool size: ceil(due items x this / throughput) processes, the run being "
        "one (the seeds' targetSize).",
    )
    size_horizon_s: float = Field(
        defaults.FLEET_SIZE_HORIZON_S,
        gt=0,
        description="The pool size's throughput: items one process claims in this many seconds.",
    )
    busy_held_s: float = Field(
        defaults.FLEET_BUSY_HELD_S,
        ge=0,
        description="Helpers busy above 0.9 this long (seconds) before a step up.",
    )
    idle_below: float = Field(
        defaults.FLEET_IDLE_BELOW,
        ge=0,
        le=1,
        description="Helpers busy less than this share of their time are idle...",
    )
    idle_held_s: float = Field(
        defaults.FLEET_IDLE_HELD_S,
        ge=0,
        description="...for this long (seconds): a step down, the surplus stopped gracefully.",
    )
    memory_high: float = Field(
        defaults.FLEET_MEMORY_HIGH,
        gt=0,
        le=1,
        description="Helpers' memory share (their cgroup's limit, else the machine's) above "
        "this: no step up...",
    )
    memory_held_s: float = Field(
        defaults.FLEET_MEMORY_HELD_S,
        ge=0,
        description="...and held this long (seconds): a step down.",
    )

    @field_validator("cron")
    @classmethod
    def _cron_shape(cls, value: str | None) -> str | None:
        if value is None:
            return None
        fields = value.split()
        if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(part) for part in fields):
            raise ValueError(
                f"cron {value!r} is not five fields of digits, names, '*', '/', ',', '-' "
                "(minute hour day month weekday), e.g. '*/15 * * * *'"
            )
        return value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"timezone {value!r} is not an IANA name such as UTC or Europe/Paris"
            ) from None
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if self.cron is not None and self.interval_s is not None:
            raise ValueError("give cron or interval_s, not both")
        if self.min_helpers > self.max_helpers:
            raise ValueError(
                f"min_helpers {self.min_helpers} is above max_helpers {self.max_helpers}"
            )
        return self

    @property
    def scheduled(self) -> bool:
        """True when the section names a schedule (cron or interval)."""
        return self.cron is not None or self.interval_s is not None

    @property
    def scaling(self) -> ScalingRules:
        """The section's scaling rules, as the autoscaler's model takes them."""
        return ScalingRules(
            min_helpers=self.min_helpers,
            scale_factor=self.scale_factor,
            depth_share=self.depth_share,
            size_horizon_s=self.size_horizon_s,
            busy_held_s=self.busy_held_s,
            idle_below=self.idle_below,
            idle_held_s=self.idle_held_s,
            memory_high=self.memory_high,
            memory_held_s=self.memory_held_s,
        )
