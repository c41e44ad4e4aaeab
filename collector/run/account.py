"""The terms of a run's account, each defined once: its name, what it means, and its sign in
the two equations a run proves (see :mod:`collector.run.ledger` for how they are counted).

A term is a field of :class:`Account` declared with :func:`term`; everything that shows the
account reads :data:`TERMS` instead of naming terms again: :class:`~collector.run.ledger.Ledger`
(the mutable owner during a run, which checks the equations, adding each batch's part:
:class:`~collector.run.summary.BatchReport`, an account of the :data:`SETTLE_TERMS` alone),
:class:`~collector.run.summary.RunSummary` (a frozen account plus how the run went, and its
``--json``), the flow's ledger artifact and the CLI's ledger table. A new term is one new field
here; a view that leaves one out fails ``tests/test_ledger_terms.py``.

The balance (every item the run took into its account ends in exactly one terminal state)::

    sum(value * term.balance) == 0     # intake terms +1, terminal states -1

The claim check (every item the run claimed was acked or given back)::

    sum(value * term.claims) == 0      # claimed +1, each way a claim ends -1; dead_lettered
                                       # counts dead letters of plan too, added back (+1)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = [
    "CLAIM_TERMS",
    "END_TERMS",
    "INTAKE_TERMS",
    "REPORTED_TERMS",
    "SETTLE_TERMS",
    "TERMS",
    "Account",
    "Term",
    "equation",
    "term",
]

Shown = Literal["always", "nonzero", "never"]


@dataclass(frozen=True, slots=True)
class Term:
    """One count of the account and where it shows."""

    name: str
    meaning: str
    balance: int = 0  # +1 intake, -1 terminal state, 0 not in the balance
    claims: int = 0  # sign in the claim check (0: not in it)
    table: Shown = "never"  # a row of the CLI's ledger table: always, when not zero, never
    note: str = ""  # the table's "of which" column, when the row is not zero
    reported: bool = False  # a row of the run's artifact table (besides the balance terms)
    settle: bool = False  # moved by a batch's settle: a term of its BatchReport

    @property
    def intake(self) -> bool:
        return self.balance > 0

    @property
    def terminal(self) -> bool:
        return self.balance < 0


def term(
    meaning: str,
    *,
    balance: int = 0,
    claims: int = 0,
    table: Shown = "never",
    note: str = "",
    reported: bool = False,
    settle: bool = False,
) -> Any:
    """An integer field of :class:`Account` (zero by default) that is a term."""
    spec = {
        "meaning": meaning,
        "balance": balance,
        "claims": claims,
        "table": table,
        "note": note,
        "reported": reported,
        "settle": settle,
    }
    return field(default=0, metadata={"term": spec})


_BY_HELPERS = "by `collector work` helpers"


@dataclass(frozen=True, slots=True, kw_only=True)
class Account:
    """A run's account as values. Ledger, RunSummary and BatchReport extend it; none repeats a
    term."""

    # --- what the run took in (+1 in the balance) ---------------------------------------------
    discovered: int = term(
        "items the plan took in: seeds listed (repeats once) or items that were due",
        balance=+1,
        table="always",
    )
    unlisted: int = term(
        "items earlier plans queued that the changed seed list no longer names",
        balance=+1,
        table="nonzero",
    )
    # --- where they ended (-1 in the balance), in the table's order ----------------------------
    stored: int = term(
        "items this run stored (acks the frontier accepted)",
        balance=-1,
        claims=-1,
        table="always",
        settle=True,
    )
    not_modified: int = term(
        "items fetched again with their validators and answered 304: done and fresh again, "
        "nothing parsed, validated or written (collector.fetch.conditional)",
        balance=-1,
        claims=-1,
        table="nonzero",
        note="answered 304 Not Modified (fresh again, nothing written)",
        settle=True,
    )
    stored_by_others: int = term(
        "this run's items stored by other workers (`collector work`)",
        balance=-1,
        table="nonzero",
        note=_BY_HELPERS,
    )
    fresh_skipped: int = term(
        "items still fresh from earlier runs, not fetched",
        balance=-1,
        table="always",
        note="still fresh from earlier runs (not fetched)",
    )
    expired: int = term(
        "items that waited in the queue past queue_ttl_s",
        balance=-1,
        table="always",
        note="waited in the queue past queue_ttl_s (not fetched; due again next run)",
    )
    dead_lettered: int = term(
        "items in the dead letters: acked dead, refused at plan, or already dead",
        balance=-1,
        claims=-1,
        table="always",
        settle=True,
    )
    dead_by_others: int = term(
        "this run's items dead-lettered by other workers",
        balance=-1,
        table="nonzero",
        note=_BY_HELPERS,
    )
    queued: int = term("items still queued when the run ended", balance=-1, table="always")
    held_by_others: int = term(
        "items leased by another live holder (a helper) when the run ended",
        balance=-1,
        table="always",
    )
    retired: int = term(
        "unlisted items this run retired (seeds.on_removed: retire)",
        balance=-1,
        table="nonzero",
        note="no longer listed (seeds.on_removed: retire)",
    )
    # --- how a claim ended (the claim check) ----------------------------------------------------
    claimed: int = term(
        "items leased by this run's claims (an item claimed twice counts twice)", claims=+1
    )
    returned: int = term("claimed items acked back to the queue", claims=-1, settle=True)
    deferred_by_circuit: int = term(
        "claims acked back unsent because the host's breaker was open (not attempts)",
        claims=-1,
        settle=True,
    )
    stale_acks: int = term(
        "outcomes refused because the lease had passed on", claims=-1, settle=True
    )
    released: int = term("claimed items of failed batches given back unchanged", claims=-1)
    # --- detail ---------------------------------------------------------------------------------
    plan: str = ""  # full | incremental | difference | "" (none)
    duplicates: int = term("seeds listed more than once, counted once in discovered")
    fresh_uncounted: int = term(
        "items still fresh from earlier runs that an incremental or difference plan did not "
        "look at (it reads only what is due): not fetched, and in neither discovered nor "
        "fresh_skipped; the frontier's count of them after the plan"
    )
    carried_over: int = term("unlisted items this run collects (unlisted - retired)")
    refused_at_plan: int = term(
        "seeds with a malformed or refused URL, dead-lettered at once", claims=+1
    )
    already_dead: int = term("items still in the dead letters from earlier runs", claims=+1)
    replanned: int = term("old plan refusals closed: the URL policy allows them now")
    renewed: int = term("queued items past their queue TTL the plan asked for again")
    records_written: int = term("records written to the sink", reported=True, settle=True)
    records_unchanged: int = term("records the sink already had, unchanged", settle=True)
    records_quarantined: int = term("records failing validation", reported=True, settle=True)
    key_collisions: int = term(
        "records that replaced an earlier record of this run with the same key",
        reported=True,
        settle=True,
    )
    retried: int = term("attempts sent back to the queue (retry later)", reported=True, settle=True)
    stale_writes: int = term("sink writes refused by the fencing token", settle=True)
    leases_reclaimed: int = term("leases of dead holders taken over")
    batches: int = term("batches settled", settle=True)
    problems: tuple[str, ...] = ()  # what does not balance

    def values(self) -> dict[str, Any]:
        """Every count of the account (and the plan kind and problems), by name."""
        return {f.name: getattr(self, f.name) for f in fields(Account)}

    def frozen(self) -> Account:
        """The account as a plain frozen value (what a summary keeps)."""
        return Account(**self.values())

    @property
    def to_fetch(self) -> int:
        """Items the plan left to fetch: taken in, less those it settled (fresh, dead before
        the run, refused); the same figure all run long (settling does not move it)."""
        return (
            self.discovered
            + self.carried_over
            - self.fresh_skipped
            - self.already_dead
            - self.refused_at_plan
        )

    @property
    def settled_items(self) -> int:
        """Items of this run that reached stored, not modified or dead here (not those dead
        before it)."""
        return (
            self.stored
            + self.not_modified
            + self.dead_lettered
            - self.already_dead
            - self.refused_at_plan
        )


TERMS: tuple[Term, ...] = tuple(
    Term(f.name, **f.metadata["term"]) for f in fields(Account) if "term" in f.metadata
)
"""Every term of the account, in definition order."""
INTAKE_TERMS = tuple(t for t in TERMS if t.intake)
END_TERMS = tuple(t for t in TERMS if t.terminal)
CLAIM_TERMS = tuple(t for t in TERMS if t.claims)
REPORTED_TERMS = tuple(t for t in TERMS if t.reported)
SETTLE_TERMS = tuple(t for t in TERMS if t.settle)
"""The terms one batch's settle moves: a :class:`~collector.run.summary.BatchReport` is an
:class:`Account` with only these set, and the ledger adds exactly them."""


def equation(values: Mapping[str, int], terms: Iterable[Term], sign: str) -> tuple[int, int, str]:
    """Both sides of one equation over ``values``: ``(left, right, "a 1 + b 2 != c 3 (= 3)")``.

    ``sign`` names the :class:`Term` attribute that holds each term's sign (``balance`` or
    ``claims``); the text is the problem line a run reports when the sides differ.
    """
    chosen = [(t, getattr(t, sign)) for t in terms if getattr(t, sign)]
    left = [t for t, s in chosen if s > 0]
    right = [t for t, s in chosen if s < 0]
    left_sum = sum(values[t.name] for t in left)
    right_sum = sum(values[t.name] for t in right)
    said = " + ".join(f"{t.name} {values[t.name]}" for t in left)
    said += " != " + " + ".join(f"{t.name} {values[t.name]}" for t in right)
    return left_sum, right_sum, f"{said} (= {right_sum})"
