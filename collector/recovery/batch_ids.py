"""A batch named by a short form of its id, as dead letters are (``deadletters show 3f2a``).

A batch id is ``<run id>:<token>``, the run id a 36-character UUID, so ``collector batches``
shows ids nobody types whole. ``compensate --batch`` and ``audit --batch`` take a unique
abbreviation: a prefix of the id (``f26a7169-4d1e``), or a prefix of its run with the whole
token (``f26a7169:67``). It is resolved to the full id before anything changes, so the ledger,
the flow run's name and every message carry the full id; an abbreviation matching several
batches changes nothing and names them. One matching none is returned as given: the caller's
"not in the sink" says so, as for a full id.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from collector.errors import ConfigError

if TYPE_CHECKING:
    from collector.run.ledger import LedgerBook

__all__ = ["resolve_batch_id", "resolve_written_batch"]

_SHOWN = 3  # candidates named when an abbreviation is ambiguous
_SHORTEST = 4  # a shorter reference is only ever taken whole (as dead-letter ids)


def resolve_batch_id(reference: str, known: Iterable[str], *, where: str) -> str:
    """The one id of ``known`` that ``reference`` abbreviates (``reference`` itself when it is
    an id of ``known`` or abbreviates none); a ConfigError (one line naming up to three
    candidates) when it abbreviates several. ``where`` names the sink in that line."""
    reference = reference.strip()
    ids = set(known)
    if reference in ids or len(reference) < _SHORTEST:
        return reference
    matches = sorted(batch for batch in ids if _abbreviates(reference, batch))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        return reference
    shown = ", ".join(matches[:_SHOWN]) + (", ..." if len(matches) > _SHOWN else "")
    raise ConfigError(
        f"batch id {reference!r} is ambiguous in {where}: {len(matches)} batches match it"
        f" ({shown}); give more characters"
    )


def resolve_written_batch(
    reference: str, held: Iterable[str], book: LedgerBook, source: str, *, where: str
) -> str:
    """:func:`resolve_batch_id` among the batches the sink holds (``held``) and those the
    ledger says were compensated, so "already compensated" is said for a short id too."""
    done = [entry.batch_id for entry in book.compensations(source)]
    return resolve_batch_id(reference, [*held, *done], where=where)


def _abbreviates(reference: str, batch_id: str) -> bool:
    if batch_id.startswith(reference):
        return True
    run, sep, token = reference.rpartition(":")
    if not (sep and run and token):
        return False
    batch_run, _, batch_token = batch_id.rpartition(":")
    return token == batch_token and batch_run.startswith(run)
