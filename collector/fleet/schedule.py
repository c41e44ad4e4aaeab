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
        return self

    @property
    def scheduled(self) -> bool:
        """True when the section names a schedule (cron or interval)."""
        return self.cron is not None or self.interval_s is not None
