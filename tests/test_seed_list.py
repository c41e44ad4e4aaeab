"""The kept copy of a listed seed list and the difference of two copies (collector.run.seedlist).

The property: whatever two lists are (repeats, moved lines, comments, spaces, CRLF, lone CR, no
final line break), ``list_change`` says exactly which URLs left, and the window it offers holds
every URL that joined and nothing the new list does not name. The oracle reads the files as
``Source.seed_urls`` does (a text file, stripped lines, no blanks, no comments).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from collector.config import load_source
from collector.errors import BackendError
from collector.run.seedlist import ListCopies, ListCopy, list_change, listed_digest
from tests.helpers import write_source

# URLs that share prefixes and suffixes, so shared runs of bytes often end inside a line
_URLS = [f"https://a.test/items/{n}" for n in ("1", "12", "2", "21", "1/x")]
_line = st.one_of(
    st.sampled_from(_URLS),
    st.sampled_from(_URLS).map(lambda url: f"  {url}\t"),
    # whitespace str.strip() removes and bytes.strip() does not: the text path's business
    st.sampled_from(_URLS).map(lambda url: f"\u00a0{url}\x1c"),
    st.just("https://a.test/caf\u00e9"),
    st.just("# a comment"),
    st.just(""),
)
_ending = st.sampled_from(["\n", "\r\n", "\r"])


def _render(draw: st.DrawFn, lines: list[str]) -> bytes:
    out = "".join(line + draw(_ending) for line in lines)
    unended: bool = draw(st.booleans())
    if unended:
        out = out.rstrip("\r\n")  # no final line break
    return out.encode()


@st.composite
def _edited(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """An old list and a new one made from it by a few edits (or drawn afresh)."""
    old = draw(st.lists(_line, max_size=12))
    new = list(old)
    if draw(st.booleans()):
        new = draw(st.lists(_line, max_size=12))
    else:
        for _ in range(draw(st.integers(0, 3))):
            at = draw(st.integers(0, len(new)))
            edit = draw(st.sampled_from(["insert", "delete", "replace"]))
            if edit == "insert" or not new:
                new.insert(at, draw(_line))
            elif edit == "delete":
                del new[min(at, len(new) - 1)]
            else:
                new[min(at, len(new) - 1)] = draw(_line)
    return _render(draw, old), _render(draw, new)


def _seeds(path: Path) -> set[str]:
    """The oracle: what Source.seed_urls reads from a seed file."""
    with path.open(encoding="utf-8") as lines:
        return {s for line in lines if (s := line.strip()) and not s.startswith("#")}


def _copy(folder: Path, name: str, data: bytes) -> ListCopy:
    return ListCopies(folder / name).write([data])


@settings(max_examples=400, deadline=None)
@given(_edited())
@example((b"https://a.test/items/1\n", b"https://a.test/items/12\n"))  # shared bytes end mid-line
@example((b"https://a.test/items/1\n2\n", b"https://a.test/items/12\n"))  # a line start in one only
@example((b"https://a.test/items/1\nhttps://a.test/items/2\n", b"https://a.test/items/2\n"))
@example(  # a repeat in the shared lines keeps the URL listed
    (
        b"https://a.test/items/1\nhttps://a.test/items/2\nhttps://a.test/items/1\n",
        b"https://a.test/items/1\nhttps://a.test/items/2\n",
    )
)
def test_the_difference_of_two_lists_is_exact(lists: tuple[bytes, bytes]) -> None:
    old_bytes, new_bytes = lists
    with tempfile.TemporaryDirectory() as folder:
        old = _copy(Path(folder), "old", old_bytes)
        new = _copy(Path(folder), "new", new_bytes)
        change = list_change(old, new)
        assert change is not None
        was, now = _seeds(old.path), _seeds(new.path)
        offered = set(new.urls(*change.added))
        assert change.removed == was - now
        assert now - was <= offered <= now
        # the lines outside the window are the same in both lists
        start, stop = change.added
        tail = len(new_bytes) - stop
        assert new_bytes[:start] == old_bytes[:start]
        assert new_bytes[len(new_bytes) - tail :] == old_bytes[len(old_bytes) - tail :]


def test_an_appended_list_offers_the_new_lines_and_reads_nothing_else(tmp_path: Path) -> None:
    old = _copy(tmp_path, "old", b"https://a.test/1\nhttps://a.test/2\n")
    new = _copy(tmp_path, "new", b"https://a.test/1\nhttps://a.test/2\nhttps://a.test/3\n")
    change = list_change(old, new)
    assert change is not None
    assert list(new.urls(*change.added)) == ["https://a.test/3"]
    assert change.removed == frozenset() and not change.new_list_read


def test_too_many_changed_old_lines_plan_in_full(tmp_path: Path) -> None:
    old = _copy(tmp_path, "old", "".join(f"https://a.test/{n}\n" for n in range(10)).encode())
    new = _copy(tmp_path, "new", b"https://b.test/0\n")
    assert list_change(old, new, max_removed=9) is None
    change = list_change(old, new, max_removed=10)
    assert change is not None and len(change.removed) == 10


def test_a_kept_copy_is_named_by_its_digest_and_replaces_the_last(tmp_path: Path) -> None:
    copies = ListCopies(tmp_path / "src")
    first = copies.keep(copies.write([b"https://a.test/1\n"]))
    assert copies.kept(first.digest) == first
    second = copies.keep(copies.write([b"https://a.test/", b"2\n"]))
    assert copies.kept(first.digest) is None  # only the last finished plan's copy is kept
    assert copies.kept(second.digest) == second
    assert list(second.urls()) == ["https://a.test/2"]
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == [f"{second.digest}.list"]


def test_the_mark_carries_the_digest_of_the_copy(tmp_path: Path) -> None:
    (tmp_path / "seeds.txt").write_text("https://a.test/1\n# c\nhttps://a.test/2\n")
    seeds = {"urls": ["https://a.test/0"], "file": "seeds.txt"}
    source = load_source(write_source(tmp_path, seeds=seeds))
    head = source.seed_list_head()
    assert head == b"https://a.test/0\n"
    copy = ListCopies(tmp_path / "copies").write(source.seed_list_blocks(head))
    mark = source.seed_mark()
    assert mark == source.seed_mark(list_digest=copy.digest)
    assert mark.endswith(f" list={copy.digest}")
    assert list(copy.urls()) == list(source.seed_urls())
    (tmp_path / "seeds.txt").write_text("https://a.test/1\n")
    edited = load_source(write_source(tmp_path, seeds=seeds)).seed_mark()
    assert listed_digest(mark, edited) == copy.digest  # only the listed seeds differ
    other = load_source(write_source(tmp_path, seeds={**seeds, "on_removed": "collect"}))
    assert listed_digest(mark, other.seed_mark()) is None  # the policy changed: a full plan


@pytest.mark.parametrize(
    "seeds",
    [
        {"urls": ["https://a.test/1"], "template": "https://a.test/{i}", "range": [0, 3]},
        {"template": "https://a.test/{i}", "range": [0, 3]},
    ],
)
def test_lists_a_copy_cannot_stand_for_are_not_copied(
    tmp_path: Path, seeds: dict[str, Any]
) -> None:
    source = load_source(write_source(tmp_path, seeds=seeds))
    assert source.seed_list_head() is None
    assert " list=" not in source.seed_mark()


@pytest.mark.parametrize("url", ["#https://a.test/2", " https://a.test/2", "https://a\n.test/"])
def test_a_literal_url_that_would_not_read_back_is_not_copied(tmp_path: Path, url: str) -> None:
    # refused when a source is loaded; the copy does not rely on that
    source = load_source(write_source(tmp_path, seeds={"urls": ["https://a.test/1"]}))
    seeds = source.seeds.model_copy(update={"urls": ("https://a.test/1", url)})
    assert source.model_copy(update={"seeds": seeds}).seed_list_head() is None


def test_a_copy_that_cannot_be_written_is_one_line_naming_where(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("a file where the state folder should be")
    with pytest.raises(BackendError) as info:
        ListCopies(tmp_path / "state" / "seedlists" / "src").write([b"https://a.test/1\n"])
    message = str(info.value)
    assert "\n" not in message
    assert f"cannot keep a copy of the seed list at {tmp_path / 'state'}" in message


def test_urls_still_named_are_found_across_blocks_and_long_lines(tmp_path: Path) -> None:
    """The new list's read for URLs that may have left: lines cut by block ends, a line longer
    than a block, CR line breaks, non-ASCII blocks (read as text)."""
    filler = [f"https://a.test/fill/{n}" for n in range(60_000)]  # > 1 MiB: several blocks
    long_line = "https://a.test/long?" + "x" * (1 << 21)
    gone = ["https://a.test/gone/1", "https://a.test/gone/2", "https://a.test/gone/3"]
    old_text = "\n".join([*gone, *filler, long_line, "https://a.test/caf\u00e9"]) + "\n"
    new_text = "\r".join([*filler[:30_000], gone[1], *filler[30_000:], long_line]) + "\r"
    new_text += "\u00a0https://a.test/caf\u00e9\u00a0\r\n" + gone[2]  # no final break
    old = _copy(tmp_path, "old", old_text.encode())
    new = _copy(tmp_path, "new", new_text.encode())
    change = list_change(old, new)
    assert change is not None and change.new_list_read
    assert change.removed == {gone[0]}
