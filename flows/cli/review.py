"""``collector review SOURCE``: a person settles escalated dead letters, one entry at a time.

``collector review SOURCE``                     on a terminal: the next entry of the source's
                                                 review queue with its payload and failed
                                                 expectations; accept it (as it is, or a
                                                 corrected record), discard it with a reason,
                                                 or put it back; then the next one
``collector review SOURCE --list``              the entries waiting in review
``collector review SOURCE --take-over``         entries held longer than ``--idle`` (15m) by a
                                                 reviewer who vanished, instead of new ones
``collector review SOURCE --id ID``             that escalated entry (id or unique prefix), out
                                                 of turn; one line if it is not in review there
                                                 or another reviewer holds it
``--accept JSON|@FILE``, ``--accept-as-is``, ``--discard REASON``, ``--put-back``
                                                 decide on the one entry taken, without prompts
                                                 (scripts and tests run the real command)

An entry is held by one reviewer at a time (the store's review queue, on SQLite or Redis); Ctrl-C
or an error while it is shown puts it back, behind the entries waiting (so does ``--put-back``:
the next call hands out the next entry); a reviewer killed outright leaves it held until someone
takes it over (or they take it again with ``--id``). A Ctrl-C is acted on only at a prompt or
during a decision; one that comes while the store hands an entry out or takes it back waits for
that call, so an entry is always either decided or back in review, never held by a command that
has gone. Accepting checks the record against the source's key and suite first and refuses what
still fails (exit 1, the entry is put back). The decisions are
:mod:`collector.recovery.review`'s. Exit codes: 0 done or nothing to review, 1 refused (or
``--id``'s entry is held by another reviewer), 2 invalid input (a decision is needed when stdin
is not a terminal; ``--id`` names no entry waiting for review), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collector.errors import ConfigError
from flows.cli._common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    SOURCE_HELP,
    load,
    positive_int,
    print_source_problems,
)
from flows.cli.deadletters import find_entry, parse_age

if TYPE_CHECKING:
    from collector.config import Source
    from collector.deadletter import DeadLetter
    from collector.deadletter.base import DeadLetters
    from collector.frontier import Frontier
    from collector.recovery.review import Decision
    from collector.settle.validation import SuiteValidator
    from collector.sinks import Sink
    from flows.cli._common import Commands

__all__ = ["cmd_review", "register"]

_PROMPT = "[a]ccept as is, [e]dit (paste a corrected record), [d]iscard, [p]ut back, [q]uit: "


class _CtrlC:
    """Ctrl-C acted on only where the command waits (for the reviewer at a prompt, for a
    decision: its checks and the source lock); elsewhere (the store handing an entry out or
    taking it back, the code between) it is remembered and acted on at the next such place, or
    at the end. An entry is then always either decided or back in review, never left held by a
    command that has gone. Off the main thread (signals are only handled there) all is as
    usual."""

    def __init__(self) -> None:
        self.pending = False
        self._open = 0

    def _handler(self, signum: int, frame: object) -> None:
        if self._open:
            raise KeyboardInterrupt
        self.pending = True

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
        self.check()

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        self.check()
        self._open += 1
        try:
            yield
        finally:
            self._open -= 1

    def check(self) -> None:
        """Act on a Ctrl-C that came while it could not be."""
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


def _record_from(text: str) -> Any:
    """``--accept``'s value: JSON text, or ``@path`` to a file holding it."""
    where = "--accept"
    if text.startswith("@"):
        path = Path(text[1:])
        where = f"--accept {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: not JSON: {exc}") from None


def _show(entry: DeadLetter) -> None:
    print(f"\n{entry.id}  {entry.reason}  {entry.url}")
    print(f"  {entry.message}")
    print(f"  attempts {entry.attempts}, record key {entry.record_key or '-'}")
    for failed in entry.failed_expectations:
        column = failed.get("column")
        print(f"  failed: {failed.get('expectation')}" + (f" ({column})" if column else ""))
    print(json.dumps(entry.payload, indent=2, ensure_ascii=False, default=str))


class _Review:
    """One command's session: the source, its backends, the reviewer, the suite (lazily)."""

    def __init__(
        self, source: Source, store: DeadLetters, frontier: Frontier, sink: Sink, reviewer: str
    ) -> None:
        self.source, self.store, self.frontier, self.sink = source, store, frontier, sink
        self.reviewer = reviewer
        self.ctrl_c = _CtrlC()
        self._validator: SuiteValidator | None = None

    def validator(self) -> SuiteValidator | None:
        if self._validator is None and self.source.suite_path is not None:
            from collector.settle.validation import SuiteValidator  # GX only when accepting

            self._validator = SuiteValidator(self.source.suite_path)
        return self._validator

    def locked(self, change: Callable[[], Decision]) -> Decision:
        """An accept's change under ``source:<name>`` (it revives a page a run may count);
        busy past ``locks.wait_s``: refused, nothing changed, the entry put back."""
        from collector.recovery.review import Decision
        from collector.run.locks import SourceBusy
        from collector.run.stop import StoppedWaiting
        from flows.cli.recovery import hold_source_lock

        try:
            return hold_source_lock(self.source, change)
        except (SourceBusy, StoppedWaiting) as exc:
            return Decision(False, f"busy: {exc}; nothing changed")

    def take(self, args: argparse.Namespace) -> tuple[str, DeadLetter] | None:
        idle_ms = int(args.idle * 1000)
        if args.id is not None:
            got = self.store.take_entry_for_review(
                self.source.name, args.id, self.reviewer,
                idle_ms=idle_ms if args.take_over else None,
            )  # fmt: skip
        elif args.take_over:
            got = self.store.claim_stale_reviews(
                self.source.name, self.reviewer, idle_ms=idle_ms, count=1
            )
        else:
            got = self.store.take_for_review(self.source.name, self.reviewer, count=1)
        return got[0] if got else None

    def not_taken(self, args: argparse.Namespace) -> int:
        """What the command says when ``take`` found nothing; its exit code."""
        if args.id is None:
            print(f"nothing to review in {self.source.name}")
            return EXIT_OK
        entry = self.store.get(args.id)
        if entry is not None and entry.status == "review":
            print(f"collector review: entry {args.id} is held by another reviewer; --take-over"
                  " --idle AGE takes it once they have been idle that long",
                  file=sys.stderr)  # fmt: skip
            return EXIT_FAILED
        status = "gone" if entry is None else entry.status
        print(f"collector review: entry {args.id} is not waiting for review in"
              f" {self.source.name} (it is {status}); `collector review {args.source} --list`"
              " shows the entries that are", file=sys.stderr)  # fmt: skip
        return EXIT_INVALID

    def decide(self, message: str, entry: DeadLetter, action: str, value: Any) -> Decision:
        with self.ctrl_c.interruptible():
            return self._decide(message, entry, action, value)

    def _decide(self, message: str, entry: DeadLetter, action: str, value: Any) -> Decision:
        from collector.recovery import review

        if action == "accept":
            return review.accept(
                self.source, entry, value, message_id=message, reviewer=self.reviewer,
                queue=self.store, frontier=self.frontier, sink=self.sink,
                validator=self.validator(), guard=self.locked,
            )  # fmt: skip
        return review.discard(
            entry, value, message_id=message, reviewer=self.reviewer, queue=self.store
        )


def _decision(args: argparse.Namespace) -> tuple[str, Any] | None:
    if args.accept is not None:
        return "accept", _record_from(args.accept)
    if args.accept_as_is:
        return "accept", None  # the entry's own payload
    if args.discard is not None:
        return "discard", args.discard
    if args.put_back:
        return "put_back", None
    return None


def _no_record(entry: DeadLetter) -> str | None:
    """Why ``entry`` has no record to accept as it is (None: it has one).

    Only a record that failed its key or the suite is kept as the payload (stage ``validate``);
    a fetch, parse or plan failure keeps the HTTP status and a body excerpt, which accepted "as
    is" would be refused for its missing key, a reason that sends a reviewer looking for a
    record that was never there."""
    if entry.stage == "validate":
        return None
    return (
        f"entry {entry.id[:12]} is a {entry.stage} failure ({entry.error_class}): it kept no"
        " record to accept as is; give one (--accept JSON|@FILE), --discard REASON, or fetch"
        " its page again (`collector deadletters retry`)"
    )


def _one(session: _Review, args: argparse.Namespace, action: str, value: Any) -> int:
    taken = session.take(args)
    if taken is None:
        return session.not_taken(args)
    message, entry = taken
    done = False
    try:
        _show(entry)
        if action == "put_back":
            done = True
            session.store.put_back(message, entry.id)
            outcome: dict[str, Any] = {"done": True, "detail": "put back"}
        elif action == "accept" and value is None and (missing := _no_record(entry)):
            outcome = {"done": False, "detail": missing, "failed": []}
        else:
            decided = session.decide(
                message, entry, action, entry.payload if value is None else value
            )
            done = decided.done
            outcome = {"done": decided.done, "detail": decided.detail, "failed": decided.failed}
    finally:
        if not done:
            session.store.put_back(message, entry.id)
    report = {"id": entry.id, "decision": action, **outcome}
    if args.json:
        print(json.dumps(report, default=str))
    else:
        print(("" if outcome["done"] else "refused, put back: ") + outcome["detail"])
    return EXIT_OK if outcome["done"] else EXIT_FAILED


def _ask(session: _Review, prompt: str) -> str:
    with session.ctrl_c.interruptible():
        return input(prompt)


def _interactive(session: _Review, args: argparse.Namespace) -> int:
    reviewed = 0
    while (taken := session.take(args)) is not None:
        message, entry = taken
        done = stop = False
        try:
            _show(entry)
            while not (done or stop):
                choice = _ask(session, _PROMPT).strip().lower()[:1]
                if choice in ("p", "q"):
                    stop = choice == "q"
                    break
                if choice == "d":
                    reason = _ask(session, "Reason for discarding (kept with the entry): ")
                    decided = session.decide(message, entry, "discard", reason)
                elif choice == "a" and (missing := _no_record(entry)):
                    print("refused: " + missing)
                    continue
                elif choice in ("a", "e"):
                    record = entry.payload
                    if choice == "e":
                        try:
                            record = _record_from(
                                _ask(session, "Corrected record (JSON, one line): ")
                            )
                        except ConfigError as exc:  # asked again, about the same entry
                            print(f"collector: {exc}", file=sys.stderr)
                            continue
                    decided = session.decide(message, entry, "accept", record)
                else:
                    continue
                done = decided.done
                print(("" if done else "refused: ") + decided.detail)
        finally:
            if not done:
                session.store.put_back(message, entry.id)
        reviewed += done
        if stop or args.id is not None:  # --id: that one entry only
            break
    if taken is None and args.id is not None:
        return session.not_taken(args)
    print(f"{reviewed} reviewed; nothing more to review in {session.source.name}"
          if taken is None else f"{reviewed} reviewed")  # fmt: skip
    return EXIT_OK


def _list(source: Source, store: DeadLetters, args: argparse.Namespace) -> int:
    entries = store.list(source=source.name, status="review", limit=args.limit)
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], default=str))
        return EXIT_OK
    from flows.cli.deadletters import print_table

    if entries:
        print_table(entries)  # the one dead-letter table: ids as `deadletters list` shows them
    print(f"{len(entries)} in review in {source.name}")
    return EXIT_OK


def cmd_review(args: argparse.Namespace) -> int:
    from collector.backends import open_deadletters, open_frontier, open_sink
    from collector.config import SourceError

    try:
        source = load(args.source)  # a file or block:NAME, as every command takes
    except SourceError as exc:
        return print_source_problems(exc)
    from flows.cli.recovery import operator_name

    reviewer = args.reviewer or operator_name()  # the login, else the OS account: never a stand-in
    decision = _decision(args)
    if not args.list and decision is None and not sys.stdin.isatty():
        print("collector: review needs a terminal, or a decision: --accept JSON|@FILE,"
              " --accept-as-is, --discard REASON or --put-back", file=sys.stderr)  # fmt: skip
        return EXIT_INVALID
    # --list only looks: a source never run here gets no store file made by it
    with open_deadletters(source, existing_only=args.list) as store:
        if args.list:
            return _list(source, store, args)
        if args.id is not None:
            args.id = find_entry(store, source, args.id).id  # a unique prefix names it too
        with open_frontier(source) as frontier, open_sink(source) as sink:
            session = _Review(source, store, frontier, sink, reviewer)
            with session.ctrl_c.installed():
                if decision is not None:
                    return _one(session, args, *decision)
                return _interactive(session, args)


def register(commands: Commands) -> None:
    """Add ``collector review`` to ``collector``'s parser."""
    review = commands.add_parser("review", help="settle escalated dead letters by hand")
    review.add_argument("source", metavar="SOURCE", help=SOURCE_HELP)
    review.add_argument(
        "--reviewer",
        default=None,
        help="your name (default: your login name, else the OS account)",
    )
    review.add_argument("--list", action="store_true", help="list the entries in review")
    review.add_argument("--limit", type=positive_int, default=100, help="entries listed (--list)")
    review.add_argument(
        "--take-over", action="store_true",
        help="take an entry held longer than --idle by a reviewer who vanished (with --id:"
        " that entry)",
    )  # fmt: skip
    review.add_argument(
        "--id", metavar="ID", default=None,
        help="the escalated entry to act on (id or unique prefix), instead of the next one",
    )  # fmt: skip
    review.add_argument(
        "--idle", type=parse_age, default=900.0, metavar="AGE",
        help="how long a held entry must have waited to be taken over (default 15m)",
    )  # fmt: skip
    decision = review.add_mutually_exclusive_group()
    decision.add_argument("--accept", metavar="JSON|@FILE", help="store this corrected record")
    decision.add_argument("--accept-as-is", action="store_true", help="store the record as kept")
    decision.add_argument("--discard", metavar="REASON", help="resolve as discarded, with why")
    decision.add_argument(
        "--put-back", action="store_true",
        help="hand the entry back, behind the others waiting (the next call gets the next one)",
    )  # fmt: skip
    review.add_argument("--json", action="store_true", help="the decision as JSON on stdout")
    review.set_defaults(func=cmd_review)
