"""Repair rules: small, declared fixes that triage may apply to a quarantined record.

A source declares what may be repaired, never how to guess (``repair:`` in the source file)::

    repair:
      rename: {Price: price, ID: id}          # a key spelled differently
      trim: [title, sku]                      # surrounding whitespace on strings
      rewrite:                                # re.sub on string values
        - {field: sku, pattern: '\\s+', replace: ''}
      coerce: {price: float, stock: int}      # "12.50" -> 12.5, "7" -> 7, 7.0 -> 7
      defaults: {currency: EUR}               # only where the key is missing or null

The steps run in that order (rename, trim, rewrite, coerce, defaults), on top-level keys, and
each says what it changed, so a triage report can show why a record passed the second time. A
value a rule cannot convert is left as it was: the record then still fails validation and goes
to a person; a rule never drops data. Regexes are compiled when the source is loaded, so a bad
one is a one-line configuration error naming the rule.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["RepairRules", "Rewrite", "coerce_value"]

CoerceType = Literal["int", "float", "str", "bool"]
_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


class Rewrite(BaseModel):
    """``re.sub(pattern, replace, value)`` on the string at ``field``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field(description="Top-level key whose string value is rewritten.")
    pattern: str = Field(description="Python regular expression.")
    replace: str = Field("", description="Replacement (\\1 refers to a group).")

    @model_validator(mode="after")
    def _compiles(self) -> Self:
        try:
            compiled = re.compile(self.pattern)
            compiled.sub(self.replace, "")  # bad group references fail here, not in triage
        except re.error as exc:
            raise ValueError(f"invalid regex {self.pattern!r}: {exc}") from None
        return self


class RepairRules(BaseModel):
    """The ``repair:`` section of a source (all empty: nothing is ever repaired)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rename: dict[str, str] = Field(
        default_factory=dict, description="Old key -> new key (when the new key is absent)."
    )
    trim: list[str] = Field(default_factory=list, description="Keys whose strings are stripped.")
    rewrite: list[Rewrite] = Field(default_factory=list, description="Regex rewrites, in order.")
    coerce: dict[str, CoerceType] = Field(
        default_factory=dict, description="Key -> int | float | str | bool."
    )
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="Key -> value used when the key is missing or null."
    )

    @property
    def empty(self) -> bool:
        return not (self.rename or self.trim or self.rewrite or self.coerce or self.defaults)

    def apply(self, record: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """A repaired copy of ``record`` and one line per change made (empty: unchanged)."""
        out = dict(record)
        changes: list[str] = []
        for old, new in self.rename.items():
            if old in out and new not in out:
                out[new] = out.pop(old)
                changes.append(f"renamed {old} -> {new}")
        for key in self.trim:
            value = out.get(key)
            if isinstance(value, str) and value != value.strip():
                out[key] = value.strip()
                changes.append(f"trimmed {key}")
        for rule in self.rewrite:
            value = out.get(rule.field)
            if isinstance(value, str):
                rewritten = re.sub(rule.pattern, rule.replace, value)
                if rewritten != value:
                    out[rule.field] = rewritten
                    changes.append(f"rewrote {rule.field} with /{rule.pattern}/")
        for key, kind in self.coerce.items():
            if key in out and out[key] is not None:
                ok, value = coerce_value(out[key], kind)
                if ok and (type(value) is not type(out[key]) or value != out[key]):
                    out[key] = value
                    changes.append(f"coerced {key} to {kind}")
        for key, value in self.defaults.items():
            if out.get(key) is None:
                out[key] = value
                changes.append(f"defaulted {key}")
        return out, changes


def coerce_value(value: Any, kind: CoerceType) -> tuple[bool, Any]:
    """``(True, converted)`` when ``value`` converts to ``kind`` without losing information."""
    if kind == "str":
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return True, value if isinstance(value, str) else str(value)
        return False, value
    if kind == "bool":
        if isinstance(value, bool):
            return True, value
        text = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if text in _TRUE:
            return True, True
        if text in _FALSE:
            return True, False
        return False, value
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False, value
    if kind == "float":
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (ValueError, OverflowError):
            return False, value
        return (True, number) if math.isfinite(number) else (False, value)
    # int: from integers, integral floats, and strings of either
    if isinstance(value, int):
        return True, value
    if isinstance(value, str):
        text = value.strip()
        try:
            return True, int(text)
        except ValueError:
            try:
                value = float(text)
            except (ValueError, OverflowError):
                return False, value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return True, int(value)
    return False, value
