"""Sink conformance: the behaviour every Sink backend must have.

A backend's test module subclasses :class:`SinkConformance` and provides two fixtures:

* ``sink``: a fresh, empty sink;
* ``reopen``: a callable that closes the current instance and returns a new instance of the
  same backend on the same storage (the test then uses only the new one).

Only the :class:`collector.sinks.base.Sink` protocol is used here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.sinks.base import Sink, SinkRecord, WriteResult

Reopen = Callable[[], Sink]


def rec(key: str, **record: Any) -> SinkRecord:
    return SinkRecord(key=key, record={"id": key, **record}, url=f"https://example.test/{key}")


def result(
    written: int = 0, unchanged: int = 0, stale_keys: list[str] | None = None
) -> WriteResult:
    stale = list(stale_keys or [])
    return WriteResult(written=written, unchanged=unchanged, stale=len(stale), stale_keys=stale)


# JSON-shaped record content (what a parser produces: NaN and infinities have no JSON literal).
# Integers are unbounded, and the values codecs get wrong are drawn on purpose: beyond 64 bits
# (orjson reads them back as floats), extreme floats, NUL and other control characters.
EDGE_VALUES = [2**70, -(2**70), -(2**63) - 1, 2**64 - 1, 2**64, 1.5e300, 5e-324, "a\u0000b"]
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from(EDGE_VALUES)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
CONTENT = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
SMALL_CONTENT = st.sampled_from(["a", "b", "c"])
KEYS = st.sampled_from(["k1", "k2", "k3"])


class SinkConformance:
    """Mixin: subclasses provide the ``sink`` and ``reopen`` fixtures."""

    def test_implements_protocol(self, sink: Sink) -> None:
        assert isinstance(sink, Sink)
        assert isinstance(sink.location(), str)
        assert sink.location()

    def test_is_a_context_manager(self, sink: Sink) -> None:
        with sink as same:
            assert same is sink
            assert same.count() == 0

    def test_empty(self, sink: Sink) -> None:
        assert sink.count() == 0
        assert sink.get("nope") is None
        assert sink.write([], token=1, batch_id="b0") == WriteResult()
        assert sink.remove_batch("nope") == 0

    def test_write_new_keys(self, sink: Sink) -> None:
        got = sink.write([rec("a", v=1), rec("b", v=2)], token=1, batch_id="b1")
        assert got == result(written=2)
        assert sink.count() == 2
        assert sink.get("a") == {"id": "a", "v": 1}
        assert sink.get("b") == {"id": "b", "v": 2}
        assert sink.get("c") is None

    def test_same_content_again_is_unchanged(self, sink: Sink) -> None:
        sink.write([rec("a", v=1), rec("b", v=2)], token=1, batch_id="b1")
        for token in (1, 2):
            again = sink.write([rec("a", v=1), rec("b", v=2)], token=token, batch_id=f"r{token}")
            assert again == result(unchanged=2)
            assert sink.count() == 2
            assert sink.get("a") == {"id": "a", "v": 1}

    def test_same_content_with_key_order_changed_is_unchanged(self, sink: Sink) -> None:
        sink.write([SinkRecord("a", {"x": 1, "y": 2}, "u")], token=1, batch_id="b1")
        again = sink.write([SinkRecord("a", {"y": 2, "x": 1}, "u")], token=1, batch_id="b2")
        assert again == result(unchanged=1)

    @pytest.mark.parametrize("newer", [0, 1, 10])
    def test_changed_content_same_or_newer_token_is_written(self, sink: Sink, newer: int) -> None:
        sink.write([rec("a", v=1), rec("b", v=1)], token=5, batch_id="b1")
        got = sink.write([rec("a", v=2)], token=5 + newer, batch_id="b2")
        assert got == result(written=1)
        assert sink.get("a") == {"id": "a", "v": 2}
        assert sink.get("b") == {"id": "b", "v": 1}
        assert sink.count() == 2

    def test_older_token_is_stale(self, sink: Sink) -> None:
        sink.write([rec("a", v=1)], token=5, batch_id="b1")
        got = sink.write([rec("a", v=2), rec("new", v=1)], token=4, batch_id="b0")
        assert got == result(written=1, stale_keys=["a"])
        assert sink.get("a") == {"id": "a", "v": 1}
        assert sink.get("new") == {"id": "new", "v": 1}
        assert sink.count() == 2

    def test_older_token_with_same_content_is_not_written(self, sink: Sink) -> None:
        sink.write([rec("a", v=1)], token=5, batch_id="b1")
        got = sink.write([rec("a", v=1)], token=4, batch_id="b0")
        assert got.written == 0
        assert got.written + got.unchanged + got.stale == 1
        assert sink.get("a") == {"id": "a", "v": 1}

    def test_unchanged_write_still_fences_older_tokens(self, sink: Sink) -> None:
        sink.write([rec("a", v=1)], token=1, batch_id="b1")  # first holder
        assert sink.write([rec("a", v=1)], token=5, batch_id="b5") == result(unchanged=1)
        # a worker that paused since token 3 comes back: the holder of token 5 owns the key
        late = sink.write([rec("a", v=2)], token=3, batch_id="b3")
        assert late == result(stale_keys=["a"])
        assert sink.get("a") == {"id": "a", "v": 1}

    def test_duplicates_within_one_write(self, sink: Sink) -> None:
        got = sink.write([rec("a", v=1), rec("a", v=1), rec("b", v=1)], token=1, batch_id="b1")
        assert got == result(written=2, unchanged=1)
        assert sink.count() == 2
        last_wins = sink.write([rec("a", v=2), rec("a", v=3)], token=1, batch_id="b2")
        assert last_wins.written + last_wins.unchanged == 2
        assert last_wins.stale == 0
        assert sink.get("a") == {"id": "a", "v": 3}
        assert sink.count() == 2

    def test_durable_across_reopen(self, sink: Sink, reopen: Reopen) -> None:
        sink.write([rec(f"k{i}", v=i) for i in range(10)], token=1, batch_id="b1")
        sink.write([rec("k3", v="changed")], token=2, batch_id="b2")
        sink.write([rec("k4", v="stale")], token=0, batch_id="b0")
        again = reopen()
        assert again.count() == 10
        assert again.get("k3") == {"id": "k3", "v": "changed"}
        assert again.get("k4") == {"id": "k4", "v": 4}
        assert again.get("k9") == {"id": "k9", "v": 9}
        # idempotence and fencing survive the reopen too
        assert again.write([rec("k9", v=9)], token=2, batch_id="b3") == result(unchanged=1)
        assert again.write([rec("k3", v="x")], token=1, batch_id="b4") == result(stale_keys=["k3"])
        third = reopen()
        assert third.count() == 10
        assert third.get("k3") == {"id": "k3", "v": "changed"}

    def test_remove_batch_removes_exactly_that_batch(self, sink: Sink, reopen: Reopen) -> None:
        sink.write([rec("a", v=1), rec("b", v=1)], token=1, batch_id="keep")
        sink.write([rec("c", v=1), rec("d", v=1)], token=2, batch_id="undo")
        sink.write([rec("e", v=1)], token=3, batch_id="keep-too")
        assert sink.remove_batch("undo") == 2
        assert sink.count() == 3
        assert sink.get("c") is None
        assert sink.get("d") is None
        assert [sink.get(k) for k in "abe"] == [{"id": k, "v": 1} for k in "abe"]
        assert sink.remove_batch("undo") == 0
        assert sink.remove_batch("never") == 0
        again = reopen()
        assert again.count() == 3
        assert again.get("c") is None
        assert again.get("a") == {"id": "a", "v": 1}

    def test_remove_batch_only_counts_keys_it_still_holds(self, sink: Sink) -> None:
        sink.write([rec("a", v=1), rec("b", v=1)], token=1, batch_id="b1")
        sink.write([rec("a", v=2)], token=2, batch_id="b2")  # b2 now holds a
        assert sink.remove_batch("b1") == 1  # only b
        assert sink.get("a") == {"id": "a", "v": 2}
        assert sink.get("b") is None
        assert sink.count() == 1

    def test_remove_batch_that_overwrote_a_key_removes_the_key(self, sink: Sink) -> None:
        """Compensation deletes what the batch holds; the version it replaced is not restored
        (the same on every backend: the item is fetched and written again)."""
        sink.write([rec("a", v=1), rec("b", v=1)], token=1, batch_id="b1")
        sink.write([rec("a", v=2)], token=2, batch_id="b2")
        assert sink.remove_batch("b2") == 1
        assert sink.get("a") is None
        assert sink.get("b") == {"id": "b", "v": 1}
        assert sink.count() == 1
        assert sink.remove_batch("b1") == 1

    def test_key_can_be_written_again_after_its_batch_was_removed(self, sink: Sink) -> None:
        sink.write([rec("a", v=1)], token=5, batch_id="b5")
        assert sink.remove_batch("b5") == 1
        assert sink.write([rec("a", v=2)], token=6, batch_id="b6") == result(written=1)
        assert sink.get("a") == {"id": "a", "v": 2}
        assert sink.count() == 1

    def test_batches_and_records_list_what_each_batch_holds(
        self, sink: Sink, reopen: Reopen
    ) -> None:
        assert sink.batches() == []
        assert sink.records("nope") == []
        sink.write([rec("b", v=1), rec("a", v=1), rec("c", v=1)], token=1, batch_id="r:1")
        sink.write([rec("d", v=1)], token=2, batch_id="r:2")
        sink.write([rec("a", v=2)], token=3, batch_id="r:3")  # r:3 now holds a
        sink.write([rec("d", v=1)], token=4, batch_id="r:4")  # unchanged: d stays r:2's
        sink.write([rec("e", v=1)], token=0, batch_id="r:0")
        sink.write([rec("e", v=2)], token=1, batch_id="r:9")  # e moves to r:9: r:0 holds none
        want = {
            "r:1": [{"id": "b", "v": 1}, {"id": "c", "v": 1}],
            "r:2": [{"id": "d", "v": 1}],
            "r:3": [{"id": "a", "v": 2}],
            "r:9": [{"id": "e", "v": 2}],
        }

        def held(s: Sink) -> dict[str, list[dict[str, Any]]]:
            return {batch: [r.record for r in s.records(batch)] for batch in s.batches()}

        assert sink.batches() == sorted(want)
        assert held(sink) == want
        assert sink.records("r:0") == sink.records("r:4") == []
        assert sink.records("r:2") == [rec("d", v=1)]  # with its key and page URL
        again = reopen()
        assert held(again) == want
        again.remove_batch("r:1")
        assert again.batches() == ["r:2", "r:3", "r:9"]
        assert again.records("r:1") == []
        assert len(again.records("r:3")) == again.remove_batch("r:3") == 1
        assert reopen().batches() == ["r:2", "r:9"]

    def test_batch_summaries_say_what_each_batch_holds_and_when_it_wrote_it(
        self, sink: Sink, reopen: Reopen
    ) -> None:
        assert sink.batch_summaries() == []
        slack = 0.01  # the database rounds its clock to microseconds

        def write(batch: str, token: int, *records: SinkRecord) -> tuple[float, float]:
            before = time.time()
            sink.write(list(records), token=token, batch_id=batch)
            return before - slack, time.time() + slack

        first = write("r:1", 1, rec("a", v=1), rec("b", v=1))
        second = write("r:2", 2, rec("c", v=1))
        write("r:3", 3, rec("c", v=1))  # unchanged: c stays r:2's, written then
        for summaries in (sink.batch_summaries(), reopen().batch_summaries()):
            assert [(s.batch_id, s.records) for s in summaries] == [("r:1", 2), ("r:2", 1)]
            assert [s.batch_id for s in summaries] == sink.batches()
            (one, two) = summaries
            assert one.written_at is not None and first[0] <= one.written_at <= first[1]
            assert two.written_at is not None and second[0] <= two.written_at <= second[1]

    def test_count_is_distinct_keys(self, sink: Sink) -> None:
        for token in range(1, 6):
            sink.write(
                [rec(f"k{i}", v=token) for i in range(token)], token=token, batch_id=str(token)
            )
        assert sink.count() == 5

    def test_nested_and_unicode_content_round_trips(self, sink: Sink, reopen: Reopen) -> None:
        content = {"name": "Ünïcödé ☃ 漢字", "nested": {"a": [1, 2.5, None, True]}, "e": ""}
        sink.write([SinkRecord("k", content, "u")], token=1, batch_id="b1")
        assert sink.get("k") == content
        assert reopen().get("k") == content

    def test_edge_values_round_trip_exactly_and_stay_unchanged(
        self, sink: Sink, reopen: Reopen
    ) -> None:
        """A value comes back as written (an int beyond 64 bits stays that int, not a float), so a
        replay of the same record after reopening is "unchanged", not a rewrite."""
        content = {f"v{i}": value for i, value in enumerate(EDGE_VALUES)}
        content["nested"] = {"big": [2**70, {"n": -(2**80)}], "text": "\u0000\u001f\u2028é☃"}
        sink.write([SinkRecord("k", content, "u")], token=1, batch_id="b1")
        assert sink.get("k") == content
        again = reopen()
        got = again.get("k")
        assert got == content
        assert got is not None and type(got["v0"]) is int
        assert [r.record for r in again.records("b1")] == [content]
        assert again.write([SinkRecord("k", content, "u")], token=1, batch_id="b2") == result(
            unchanged=1
        )

    # --- properties ---------------------------------------------------------------------------
    def _check_last_highest_token_wins(
        self, sink: Sink, reopen: Reopen, writes_strategy: st.SearchStrategy[Any]
    ) -> None:
        current = {"sink": sink}
        expected: dict[str, Any] = {}  # every key of every example, prefixed per example

        @settings(
            max_examples=60,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(writes=writes_strategy)
        def run(writes: list[tuple[int, list[tuple[str, Any]]]]) -> None:
            s = current["sink"]
            prefix = uuid.uuid4().hex[:8]  # keys of this example only: examples don't interact
            model: dict[str, tuple[int, Any]] = {}  # key -> (highest token seen, content)
            before = s.count()
            for n, (token, batch) in enumerate(writes):
                want = WriteResult()
                for key, content in batch:
                    prev = model.get(key)
                    if prev is not None and token < prev[0]:
                        want.stale += 1
                        want.stale_keys.append(f"{prefix}{key}")
                    elif prev is not None and prev[1] == content:
                        want.unchanged += 1
                        model[key] = (token, content)
                    else:
                        want.written += 1
                        model[key] = (token, content)
                records = [SinkRecord(f"{prefix}{k}", {"c": c}, "u") for k, c in batch]
                got = s.write(records, token=token, batch_id=f"{prefix}-{n}")
                assert got == want
            for key, (_, content) in model.items():
                assert s.get(f"{prefix}{key}") == {"c": content}
                expected[f"{prefix}{key}"] = {"c": content}
            assert s.count() == before + len(model)

        run()
        again = reopen()
        assert again.count() == len(expected)
        for key, record in expected.items():
            assert again.get(key) == record

    def test_property_nondecreasing_tokens(self, sink: Sink, reopen: Reopen) -> None:
        """Tokens that only grow (the common case): last write wins, with exact results."""
        batches = st.lists(
            st.tuples(st.integers(0, 2), st.lists(st.tuples(KEYS, CONTENT), max_size=4)),
            max_size=8,
        )

        @st.composite
        def rising(draw: st.DrawFn) -> list[tuple[int, list[tuple[str, Any]]]]:
            token, out = 1, []
            for step, batch in draw(batches):
                token += step
                out.append((token, batch))
            return out

        self._check_last_highest_token_wins(sink, reopen, rising())

    def test_property_any_tokens_new_content(self, sink: Sink, reopen: Reopen) -> None:
        """Any tokens, every write with new content: the highest token wins, the rest stale."""

        @st.composite
        def fresh_content(draw: st.DrawFn) -> list[tuple[int, list[tuple[str, Any]]]]:
            out = []
            for n, (token, keys) in enumerate(
                draw(st.lists(st.tuples(st.integers(1, 5), st.lists(KEYS, max_size=4)), max_size=8))
            ):
                out.append((token, [(k, f"{n}.{i}") for i, k in enumerate(keys)]))
            return out

        self._check_last_highest_token_wins(sink, reopen, fresh_content())

    def test_property_any_tokens(self, sink: Sink, reopen: Reopen) -> None:
        """Any tokens: each key ends with the last write of the highest token."""
        writes = st.lists(
            st.tuples(st.integers(1, 5), st.lists(st.tuples(KEYS, SMALL_CONTENT), max_size=4)),
            max_size=8,
        )
        self._check_last_highest_token_wins(sink, reopen, writes)


class SharedSinkConformance:
    """Mixin for sinks that several workers share: subclasses provide ``sink`` and ``another``,
    two instances open at once on the same storage (two workers, two connections).

    Fencing must hold *between* them: the token stored by one is the one the other is checked
    against, so a worker that paused past its lease cannot overwrite the new holder's record.
    """

    def test_older_token_from_another_worker_is_refused(self, sink: Sink, another: Sink) -> None:
        assert sink.write([rec("a", v=1)], token=5, batch_id="w1-5") == result(written=1)
        late = another.write([rec("a", v=2), rec("b", v=1)], token=4, batch_id="w2-4")
        assert late == result(written=1, stale_keys=["a"])
        for s in (sink, another):
            assert s.get("a") == {"id": "a", "v": 1}
            assert s.get("b") == {"id": "b", "v": 1}
            assert s.count() == 2

    def test_newer_token_from_another_worker_wins(self, sink: Sink, another: Sink) -> None:
        sink.write([rec("a", v=1)], token=1, batch_id="w1-1")
        assert another.write([rec("a", v=2)], token=2, batch_id="w2-2") == result(written=1)
        assert sink.get("a") == {"id": "a", "v": 2}
        # the first worker comes back from a pause with its old lease: refused, counted
        assert sink.write([rec("a", v=3)], token=1, batch_id="w1-1b") == result(stale_keys=["a"])
        assert another.get("a") == {"id": "a", "v": 2}

    def test_unchanged_write_of_one_worker_fences_the_other(
        self, sink: Sink, another: Sink
    ) -> None:
        sink.write([rec("a", v=1)], token=1, batch_id="w1-1")
        assert another.write([rec("a", v=1)], token=7, batch_id="w2-7") == result(unchanged=1)
        assert sink.write([rec("a", v=9)], token=6, batch_id="w1-6") == result(stale_keys=["a"])
        assert another.get("a") == {"id": "a", "v": 1}

    def test_same_content_from_both_workers_is_stored_once(self, sink: Sink, another: Sink) -> None:
        assert sink.write([rec("a", v=1)], token=3, batch_id="w1") == result(written=1)
        assert another.write([rec("a", v=1)], token=3, batch_id="w2") == result(unchanged=1)
        assert sink.count() == another.count() == 1

    def test_compensation_by_one_worker_is_seen_by_the_other(
        self, sink: Sink, another: Sink
    ) -> None:
        sink.write([rec("a", v=1), rec("b", v=1)], token=1, batch_id="w1-1")
        another.write([rec("b", v=2), rec("c", v=1)], token=2, batch_id="w2-2")
        assert another.remove_batch("w1-1") == 1  # only a: b now belongs to w2-2
        assert sink.get("a") is None
        assert sink.get("b") == {"id": "b", "v": 2}
        assert sink.count() == 2
