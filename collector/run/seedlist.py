"""The seed list as the last finished plan read it, kept so an edit is planned by its difference.

A changed template range says by itself what joined and what left the list (collector.run.seeds).
A seed *file* (or the ``urls`` list) does not: what left it is only known by comparing the old
list with the new one. So a plan keeps a copy of the list it read (the ``urls`` a line each,
then the file's bytes) in ``<state_dir>/seedlists/``, named by its digest, which the seed mark
carries (``list=<digest>``, :meth:`collector.config.Source.seed_mark`). The plan reads its seeds
from that copy, never from the live file, so an edit made while it runs is the next plan's.

When the next plan finds the mark changed in its list alone and the copy the stored mark names,
:func:`list_change` compares the two copies as bytes (C speed, a MiB at a time): the lines they
share at the start and at the end are the same seeds in both lists; only the lines between
differ. The new lines between are offered (a URL the frontier holds already is decided as a full
plan decides it). The old lines between are the URLs that may have left; any the new list still
names (a repeat, a moved line) is found by one read of the new list.

So appending to a file offers the appended lines and reads nothing else; an edit in the middle
offers the changed lines and reads the file once (no writes); a file reordered as a whole is
offered as a whole, or planned in full when more than ``max_removed`` old lines would have to be
held (the URLs that may have left are the one thing kept in memory).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from collector.errors import BackendError

__all__ = ["ListChange", "ListCopies", "ListCopy", "list_change", "listed_digest", "named_in"]

_BLOCK = 1 << 20
MAX_REMOVED = 200_000  # old lines held while their URLs are looked for in the new list


def listed_digest(stored: str | None, mark: str) -> str | None:
    """The list digest of ``stored`` when it and ``mark`` differ in their listed seeds alone."""
    if stored is None:
        return None
    old_rest, _, old_list = stored.partition(" list=")
    new_rest, _, new_list = mark.partition(" list=")
    if not old_list or not new_list or old_rest != new_rest or old_list == new_list:
        return None
    return old_list


@dataclass(frozen=True, slots=True)
class ListCopy:
    """A copy of a listed seed list: its file and the SHA-256 of its bytes."""

    path: Path
    digest: str

    def urls(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """The seeds of the copy's bytes ``[start, stop)`` (both at line starts), as
        :meth:`collector.config.Source.seed_urls` reads a seed file: stripped, no blank lines,
        no ``#`` comments, universal newlines."""
        with self.path.open("rb") as handle:
            end = os.fstat(handle.fileno()).st_size if stop is None else stop
            handle.seek(start)
            window = io.BufferedReader(_Window(handle, end - start), _BLOCK)
            with io.TextIOWrapper(window, encoding="utf-8") as lines:
                for line in lines:
                    url = line.strip()
                    if url and not url.startswith("#"):
                        yield url


class ListCopies:
    """A source's list copies: ``<folder>/<digest>.list``, one kept (the last finished plan's).

    ``folder`` is the source's own (``<state_dir>/seedlists/<name>``).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def kept(self, digest: str) -> ListCopy | None:
        """The copy with that digest, if this machine kept it."""
        path = self.folder / f"{digest}.list"
        return ListCopy(path, digest) if path.is_file() else None

    def write(self, blocks: Iterable[bytes]) -> ListCopy:
        """Copy ``blocks`` to a pending file, hashing them on the way."""
        pending = self.folder / "pending"
        digest = hashlib.sha256()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with pending.open("wb") as out:
                for block in blocks:
                    digest.update(block)
                    out.write(block)
        except OSError as exc:
            raise _unwritable(pending, exc) from None
        return ListCopy(pending, digest.hexdigest())

    def keep(self, copy: ListCopy) -> ListCopy:
        """Make ``copy`` the kept one (an atomic rename) and drop the others of the source."""
        kept = self.folder / f"{copy.digest}.list"
        try:
            os.replace(copy.path, kept)
            for other in self.folder.glob("*.list"):
                if other != kept:
                    other.unlink(missing_ok=True)
        except OSError as exc:
            raise _unwritable(kept, exc) from None
        return ListCopy(kept, copy.digest)


def _unwritable(path: Path, exc: OSError) -> BackendError:
    return BackendError(
        f"cannot keep a copy of the seed list at {path}: {exc.strerror or exc}"
        " (the plan reads its seeds from it; state_dir must be writable)"
    )


@dataclass(frozen=True, slots=True)
class ListChange:
    """What an edit did to a listed seed list: the new copy's changed bytes and who left."""

    added: tuple[int, int]  # [start, stop) in the new copy: the lines to offer
    removed: frozenset[str]  # URLs of the old list that the new one no longer names
    new_list_read: bool  # the new list was read to look for URLs that are still named


def list_change(
    old: ListCopy, new: ListCopy, *, max_removed: int = MAX_REMOVED
) -> ListChange | None:
    """Compare two copies; None when more than ``max_removed`` old lines changed.

    The copies split as ``old = P + gone + S`` and ``new = P + added + S``, ``P`` and ``S`` the
    longest shared runs of whole lines at the start and at the end (they never overlap).
    """
    with old.path.open("rb") as a, new.path.open("rb") as b:
        size_a, size_b = os.fstat(a.fileno()).st_size, os.fstat(b.fileno()).st_size
        shared = _common_prefix(a, b, min(size_a, size_b))
        head = _line_start_at_or_before(a, shared)
        tail = _common_suffix(a, b, size_a, size_b, min(size_a, size_b) - head)
        tail = _aligned_suffix(a, b, size_a, size_b, tail)
    gone_stop, added_stop = size_a - tail, size_b - tail
    candidates: set[str] = set()
    for url in old.urls(head, gone_stop):
        candidates.add(url)
        if len(candidates) > max_removed:
            return None
    read = False
    if candidates:  # a URL may be listed twice, or have moved: still named, it stays
        read = True
        _discard_named(new, candidates)
    return ListChange((head, added_stop), frozenset(candidates), read)


def named_in(copy: ListCopy, urls: Iterable[str]) -> set[str]:
    """Which of ``urls`` the copy names (one read of it; see :func:`_discard_named`)."""
    wanted = set(urls)
    missing = set(wanted)
    _discard_named(copy, missing)
    return wanted - missing


# bytes.strip() strips these; str.strip() strips \x1c-\x1f and non-ASCII spaces too
_SPACES = (b" ", b"\t", b"\x0b", b"\x0c")
_SEPARATORS = (b"\x1c", b"\x1d", b"\x1e", b"\x1f")


def _discard_named(copy: ListCopy, urls: set[str]) -> None:
    """Remove from ``urls`` every URL the copy names: one read of it, a MiB at a time.

    The common block (ASCII, no separator characters) is matched as bytes: line breaks of every
    kind made ``\n``, split in C, stripped only when the block holds a space or tab, looked up
    in C (~0.1 us a line against ~0.75 through a text reader); any other block is read as text
    exactly as :meth:`ListCopy.urls` reads it.
    """
    wanted = {url.encode("utf-8"): url for url in urls}
    keys = set(wanted)  # intersection() walks the lines and looks each up here
    rest = b""
    with copy.path.open("rb") as handle:
        while wanted:
            chunk = handle.read(_BLOCK)
            if chunk:  # whole lines only: what follows the last line feed waits for the next
                cut = chunk.rfind(b"\n") + 1
                if not cut:
                    rest += chunk  # a line longer than a block: read on
                    continue
                block, rest = rest + chunk[:cut], chunk[cut:]
            elif rest:
                block, rest = rest, b""
            else:
                break
            if not block.isascii() or any(c in block for c in _SEPARATORS):
                lines: Iterable[bytes] = {
                    line.strip().encode("utf-8")
                    for line in io.StringIO(block.decode("utf-8"), newline=None)
                }
            else:  # every kind of line break made \n; stripped only where there is a space
                lines = block.replace(b"\r", b"\n").split(b"\n")
                if any(c in block for c in _SPACES):
                    lines = map(bytes.strip, lines)
            for found in keys.intersection(lines):
                keys.discard(found)
                urls.discard(wanted.pop(found))


# --- finding the shared lines --------------------------------------------------------------
def _first_mismatch(x: bytes, y: bytes) -> int:
    """Length of the common prefix of ``x`` and ``y`` (bisection over C-speed comparisons)."""
    low, high = 0, min(len(x), len(y))
    while low < high:
        middle = (low + high + 1) // 2
        if x[:middle] == y[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _common_prefix(a: BinaryIO, b: BinaryIO, limit: int) -> int:
    a.seek(0)
    b.seek(0)
    done = 0
    while done < limit:
        size = min(_BLOCK, limit - done)
        x, y = a.read(size), b.read(size)
        if x != y:
            return done + _first_mismatch(x, y)
        done += size
    return done


def _common_suffix(a: BinaryIO, b: BinaryIO, size_a: int, size_b: int, limit: int) -> int:
    done = 0
    while done < limit:
        size = min(_BLOCK, limit - done)
        a.seek(size_a - done - size)
        b.seek(size_b - done - size)
        x, y = a.read(size), b.read(size)
        if x != y:
            return done + _first_mismatch(x[::-1], y[::-1])
        done += size
    return done


def _line_start_at_or_before(handle: BinaryIO, position: int) -> int:
    """The start of the line ``position`` is in (a position right after a line feed, or 0)."""
    while position > 0:
        start = max(0, position - _BLOCK)
        handle.seek(start)
        found = handle.read(position - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        position = start
    return 0


def _is_line_start(handle: BinaryIO, position: int) -> bool:
    if position == 0:
        return True
    handle.seek(position - 1)
    return handle.read(1) == b"\n"


def _aligned_suffix(a: BinaryIO, b: BinaryIO, size_a: int, size_b: int, tail: int) -> int:
    """The longest shared suffix of whole lines within ``tail`` shared bytes.

    Its start must be a line start in both copies. Where it is not, the first line feed inside
    the shared bytes (the same byte in both copies) gives one.
    """
    if tail == 0:
        return 0
    start_a = size_a - tail
    if _is_line_start(a, start_a) and _is_line_start(b, size_b - tail):
        return tail
    position = start_a
    while position < size_a:
        a.seek(position)
        block = a.read(min(_BLOCK, size_a - position))
        found = block.find(b"\n")
        if found >= 0:
            return size_a - (position + found + 1)
        position += len(block)
    return 0


class _Window(io.RawIOBase):
    """At most ``size`` bytes of ``handle`` from where it stands: a line reader's bounded view."""

    def __init__(self, handle: BinaryIO, size: int) -> None:
        self._handle = handle
        self._left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = min(len(buffer), self._left)
        if size <= 0:
            return 0
        data = self._handle.read(size)
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)
