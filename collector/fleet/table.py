"""When the fleet's table artifact gets a new version.

Prefect keeps every version of an artifact as a row of its database. The fleet decides every
second, and its figures (backlog, claim wait, CPU, the words of each "why") change at nearly
every decision: one version per decision was about 3,600 rows an hour for a table an operator
reads now and then, and as many writes to the API. So a new version is written at once when
what the fleet *did* changes (a source's helpers, those on their way, its share, a source added
or gone), and for changed figures alone at most every :data:`FIGURES_EVERY_S`. When the fleet
ends it writes the table it last computed if that one was held back, so the last version is
always the fleet's last word.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FIGURES_EVERY_S", "SUBSTANCE", "TablePacer"]

FIGURES_EVERY_S = 15.0
# the columns that say what the fleet did; every other column is a figure of the moment
SUBSTANCE = ("source", "class", "helpers", "coming", "share")

Table = Sequence[dict[str, Any]]


def _substance(table: Table) -> list[tuple[Any, ...]]:
    return [tuple(row.get(column) for column in SUBSTANCE) for row in table]


@dataclass
class TablePacer:
    """Decides, for each table the fleet computes, whether it is worth a new version."""

    figures_every_s: float = FIGURES_EVERY_S
    shown: list[dict[str, Any]] | None = None  # the version written last
    shown_at: float = -math.inf
    versions: int = 0  # written so far (the fleet's result says it: ``tables_shown``)
    figure_versions: int = 0  # of those, the ones for figures alone (``table_figure_versions``)

    def due(self, table: Table, now: float) -> bool:
        """Whether ``table``, computed at ``now`` (seconds), should be written now."""
        if self.shown is not None and list(table) == self.shown:
            return False
        if self.shown is None or _substance(table) != _substance(self.shown):
            return True
        return now - self.shown_at >= self.figures_every_s

    def written(self, table: Table, now: float) -> None:
        if self.shown is not None and _substance(table) == _substance(self.shown):
            self.figure_versions += 1
        self.shown = list(table)
        self.shown_at = now
        self.versions += 1

    def held_back(self, table: Table | None) -> bool:
        """Whether ``table`` (the last one computed) differs from the last version written."""
        return table is not None and list(table) != self.shown
