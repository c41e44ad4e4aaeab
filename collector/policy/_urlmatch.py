"""The URL matcher shared by per-URL rules (freshness, priority): a regex or a prefix."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from collector._text import quoted

__all__ = ["UrlMatch"]


class UrlMatch(BaseModel):
    """Matches a URL by regular expression (searched) or by prefix; exactly one is given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str | None = Field(None, description="Regular expression searched in the URL.")
    prefix: str | None = Field(None, description="URL prefix (plain string).")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"invalid regular expression {quoted(value)}: {exc}") from None
        return value

    @model_validator(mode="after")
    def _exactly_one_matcher(self) -> Self:
        if (self.pattern is None) == (self.prefix is None):
            raise ValueError("give exactly one of 'pattern' (regex) or 'prefix'")
        return self

    def matches(self, url: str) -> bool:
        if self.prefix is not None:
            return url.startswith(self.prefix)
        return self._regex.search(url) is not None

    @cached_property
    def _regex(self) -> re.Pattern[str]:
        return re.compile(self.pattern or "")
