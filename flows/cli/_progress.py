"""The terminal's progress display of ``collector run`` / ``work`` / ``demo``.

Two parts, so that neither is cut: the bar's line (what it does, the bar, items settled of
those to fetch, the time) and, under it, the run's account so far: every term of the ledger
that is not zero, by the names the ledger table uses, wrapped between terms to the terminal's
width (at 80 columns too).

It moves per item without costing the fetch loop: an item's end (``fetched``) only adds one
to a counter; the display's own refresh thread (10 times a second) reads the counter when it
draws. The account under the bar changes when a batch settles (``batch``), from the ledger.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from collector.run.account import END_TERMS

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from collector.run.account import Account
    from collector.run.summary import RunSummary

__all__ = ["Progress", "account_words", "wrapped"]

# Terms besides the terminal states that say what the run is doing while it runs: items sent
# back to be retried later, held back by an open breaker; fresh items the plan did not read.
_WHILE_RUNNING = ("retried", "deferred_by_circuit", "fresh_uncounted")


def account_words(ledger: Account, *, at_end: bool = False) -> list[str]:
    """``name count`` for every term of the account that is not zero, as the ledger table
    counts it: the terminal states (``already_dead``: of the dead, those dead before this run),
    then what is in flight.
    Before the end, ``queued`` / ``expired`` / ``held_by_others`` are not known yet (read from
    the frontier when the run closes) and are left out."""
    words = []
    for term in END_TERMS:
        count = getattr(ledger, term.name)
        if not at_end and term.name in ("queued", "expired", "held_by_others"):
            continue
        if count:
            words.append(f"{term.name} {count}")
    if ledger.already_dead:
        words.append(f"already_dead {ledger.already_dead}")
    words += [f"{name} {getattr(ledger, name)}" for name in _WHILE_RUNNING if getattr(ledger, name)]
    return words


def wrapped(words: Iterable[str], width: int, indent: str = "  ") -> list[str]:
    """``words`` two spaces apart, in lines no wider than ``width``, broken between words."""
    lines: list[str] = []
    line = ""
    for word in words:
        if line and len(indent) + len(line) + 2 + len(word) > width:
            lines.append(indent + line)
            line = ""
        line = f"{line}  {word}" if line else word
    if line:
        lines.append(indent + line)
    return lines


def hosts_words(windows: dict[str, int], slowed: dict[str, str] | None = None) -> list[str]:
    """The adaptive window (one host) or its range (several), and hosts slowed by their window
    or pace (docs/politeness.md)."""
    words = []
    if len(windows) == 1:
        words.append(f"window {next(iter(windows.values()))}")
    elif windows:
        words.append(f"windows {min(windows.values())}-{max(windows.values())}")
    if slowed:
        words.append(f"{len(slowed)} host{'s' if len(slowed) > 1 else ''} slowed")
    return words


class Progress:
    """The display: :meth:`start` it, feed it the flow's progress events (call it with
    ``(event, data)``), :meth:`finish` it with the summary (its last state stays on screen).

    Events: ``planned`` (how many to fetch), ``fetched`` (one item's fetch ended), ``batch``
    (a batch settled: the ledger), ``waiting`` (retry-later items not due yet), ``lock_busy``.
    An item sent back to the queue to be retried later is counted when it finishes.
    """

    def __init__(self, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.console = console
        self.ended = 0  # items whose fetch ended for good (the per-item counter, see module)
        self.settled = 0  # items the ledger has settled (stored, not modified, dead)
        self.words: list[str] = []  # the account under the bar
        self.status = ""  # what the run waits for, after the account
        self.hosts: list[str] = []  # the hosts' windows and slowdowns, as the last batch saw
        self._progress: Any = None
        self._task: Any = None

    def start(self, phase: str) -> None:
        if not self.enabled or self.console is None:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.progress import Progress as Bar

        owner = self

        class _Display(Bar):
            def get_renderables(self) -> Iterator[RenderableType]:
                owner._poll()
                yield from super().get_renderables()
                lines = owner.lines(owner.width())
                if lines:
                    from rich.text import Text

                    yield Text("\n".join(lines), no_wrap=True, overflow="crop")

        self._progress = _Display(
            SpinnerColumn(finished_text="[green]done"),
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=False,  # the final state stays as the run's last progress lines
        )
        self._progress.start()
        self._task = self._progress.add_task(phase, total=None)

    def width(self) -> int:
        return self.console.width if self.console is not None else 80

    def lines(self, width: int) -> list[str]:
        """The lines under the bar: the account, then what the run waits for."""
        words = [*self.words, *([self.status] if self.status else [])]
        return wrapped(words, max(width, 20))

    def _poll(self) -> None:
        """Move the bar to the items ended so far (on the display's refresh)."""
        if self._progress is None or self._task is None:
            return
        task = self._progress.tasks[0]
        done = max(self.ended, self.settled)
        if task.total is not None:
            done = min(done, int(task.total))
        if done != task.completed:
            self._progress.update(self._task, completed=done)

    def __call__(self, event: str, data: dict[str, Any]) -> None:
        if event == "fetched":  # per item: a counter only (the fetch loop's cost)
            decision = data.get("decision")
            if data["status"] in ("ok", "not_modified") or (
                decision is not None and decision.action == "dead"
            ):
                self.ended += 1
            return
        if self._progress is None:
            return
        if event == "planned":
            self._progress.update(self._task, description="collect", total=data["to_fetch"])
            self.words = [f"discovered {data['discovered']}"]
        elif event == "batch":
            ledger, report = data["ledger"], data["report"]
            self.settled = ledger.settled_items
            self.status = ""
            self.hosts = hosts_words(report.windows, report.slowed)
            self.words = [f"discovered {ledger.discovered}", *account_words(ledger), *self.hosts]
        elif event == "lock_busy":
            self._progress.update(self._task, description="waiting for the source lock")
        elif event == "waiting":
            self.status = f"waiting {data['seconds']:.1f}s for retries"

    def finish(self, summary: RunSummary | None) -> None:
        """Stop the display; with a summary, its last state shows what was settled."""
        if self._progress is None:
            return
        if summary is not None and not summary.skipped:
            task = self._progress.tasks[0]
            total = int(task.total) if task.total is not None else 0
            self.settled = summary.settled_items
            self.status = ""
            words = account_words(summary, at_end=True)
            self.words = [f"discovered {summary.discovered}", *words, *self.hosts]
            self._progress.update(
                self._task,
                total=total,
                completed=min(total, max(self.ended, self.settled)),
                description="stopped" if summary.interrupted else "collected",
            )
        self._progress.stop()
        self._progress = None
