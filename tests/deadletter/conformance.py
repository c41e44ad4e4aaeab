"""Dead-letter store conformance: the behaviour every DeadLetterStore backend must have.

One suite per protocol of :mod:`collector.deadletter.base`: :class:`StoreConformance`
(:class:`~collector.deadletter.base.DeadLetterStore`), :class:`TriageClaimsConformance` and
:class:`ReviewQueueConformance`; :class:`DeadLetterConformance` is all three. A backend's test
module subclasses one and provides a ``store`` fixture that yields a fresh, empty store. Only
the protocols are used here.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from collector.deadletter.base import (
    DeadLetter,
    DeadLetters,
    DeadLetterStore,
    ResolutionKind,
    ReviewQueue,
    TriageClaims,
    dead_letter_id,
)

T0 = 1_700_000_000.0


def letter(
    url: str = "https://example.test/1",
    *,
    source: str = "src",
    stage: Any = "fetch",
    error_class: str = "http_500",
    key: str = "",
    attempts: int = 1,
    seen: float = T0,
    message: str = "boom",
    payload: Any = None,
    **extra: Any,
) -> DeadLetter:
    return DeadLetter(
        source=source,
        url=url,
        stage=stage,
        error_class=error_class,
        message=message,
        attempts=attempts,
        first_seen=seen,
        last_seen=seen,
        record_key=key,
        payload=payload,
        **extra,
    )


def ids(entries: list[DeadLetter]) -> set[str]:
    return {e.id for e in entries}


class StoreConformance:
    """The entries. Mixin: subclasses provide the ``store`` fixture (a fresh, empty store)."""

    def test_implements_protocol(self, store: DeadLetterStore) -> None:
        assert isinstance(store, DeadLetterStore)
        assert store.location()

    def test_is_a_context_manager(self, store: DeadLetterStore) -> None:
        with store as same:
            assert same is store
            assert same.put([letter()]) == 1

    def test_empty(self, store: DeadLetterStore) -> None:
        assert store.put([]) == 0
        assert store.list() == []
        assert store.list(status=None) == []
        assert store.get("nope") is None
        assert store.counts() == {"open": 0, "review": 0, "resolved": 0}
        assert store.reasons("src") == {}

    def test_put_new_returns_how_many_are_new(self, store: DeadLetterStore) -> None:
        a, b = letter("https://example.test/a"), letter("https://example.test/b")
        assert store.put([a, b]) == 2
        c = letter("https://example.test/c")
        assert store.put([a, c]) == 1
        assert store.counts() == {"open": 3, "review": 0, "resolved": 0}

    def test_get_returns_what_was_put(self, store: DeadLetterStore) -> None:
        entry = letter(
            key="rec-1",
            stage="validate",
            error_class="expectation_failed",
            attempts=2,
            message="price must be positive",
            payload={"id": 1, "price": -3},
            failed_expectations=[{"expectation": "expect_column_values_to_be_between"}],
            flow_run_id="run-42",
            trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
            url_digest="0f" * 16,
            span_id="00f067aa0ba902b7",
        )
        store.put([entry])
        got = store.get(entry.id)
        assert got is not None
        assert got.to_dict() == entry.to_dict()
        assert got.status == "open"
        assert got.resolution is None
        assert got.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert got.span_id == "00f067aa0ba902b7"

    def test_same_failure_again_updates_one_entry(self, store: DeadLetterStore) -> None:
        first = letter(attempts=3, seen=T0, message="first")
        assert store.put([first]) == 1
        again = letter(attempts=2, seen=T0 + 100, message="second")
        assert again.id == first.id
        assert store.put([again]) == 0
        got = store.get(first.id)
        assert got is not None
        assert got.attempts == 3  # the max, not the latest
        assert got.first_seen == T0
        assert got.last_seen == T0 + 100
        assert store.put([letter(attempts=5, seen=T0 + 200)]) == 0
        got = store.get(first.id)
        assert got is not None
        assert (got.attempts, got.last_seen) == (5, T0 + 200)
        assert len(store.list(status=None)) == 1
        assert store.counts()["open"] == 1

    def test_url_digest_is_kept_and_follows_the_latest_put(self, store: DeadLetterStore) -> None:
        """The digest of the real URL (the stored URL is scrubbed) is what a re-plan matches:
        kept by every read, replaced when the same failure is seen again, empty when absent."""
        masked = "https://[redacted]@example.test/1"
        first = letter(masked, stage="plan", error_class="refused_url", url_digest="aa" * 16)
        store.put([first, letter("https://example.test/2")])
        got = store.get(first.id)
        assert got is not None and got.url_digest == "aa" * 16
        listed = {e.url: e.url_digest for e in store.list(source="src")}
        assert listed == {masked: "aa" * 16, "https://example.test/2": ""}
        again = letter(masked, stage="plan", error_class="refused_url", url_digest="bb" * 16,
                       seen=T0 + 5)  # fmt: skip
        assert store.put([again]) == 0
        got = store.get(first.id)
        assert got is not None and (got.url_digest, got.last_seen) == ("bb" * 16, T0 + 5)

    def test_duplicates_within_one_put_count_once(self, store: DeadLetterStore) -> None:
        assert store.put([letter(attempts=1), letter(attempts=4, seen=T0 + 1)]) == 1
        (only,) = store.list()
        assert only.attempts == 4

    def test_identity_fields_make_distinct_entries(self, store: DeadLetterStore) -> None:
        entries = [
            letter(),
            letter(source="other"),
            letter("https://example.test/2"),
            letter(stage="parse"),
            letter(error_class="timeout"),
            letter(key="rec-1"),
        ]
        assert len(ids(entries)) == len(entries)
        assert store.put(entries) == len(entries)
        assert len(store.list(status=None)) == len(entries)

    def test_cause_is_a_field_not_part_of_the_identity(self, store: DeadLetterStore) -> None:
        plain = letter(error_class="http_500")
        exhausted = letter(error_class="http_500", cause="retries_exhausted", seen=T0 + 1)
        assert (
            plain.id
            == exhausted.id
            == dead_letter_id("src", "https://example.test/1", "fetch", "http_500")
        )
        assert store.put([plain]) == 1
        assert store.put([exhausted]) == 0
        got = store.get(plain.id)
        assert got is not None
        assert (got.error_class, got.cause, got.reason) == (
            "http_500",
            "retries_exhausted",
            "fetch/retries_exhausted:http_500",
        )
        with pytest.raises(ValueError, match="final class"):
            letter(error_class="retries_exhausted:http_500")
        with pytest.raises(ValueError, match="cause"):
            letter(cause="gave_up")

    def test_list_filters(self, store: DeadLetterStore) -> None:
        entries = {
            "a-fetch-500": letter("https://example.test/1", error_class="http_500"),
            "a-fetch-ex": letter(
                "https://example.test/2", error_class="http_500", cause="retries_exhausted"
            ),
            "a-fetch-404": letter("https://example.test/3", error_class="http_404"),
            "a-fetch-5000": letter("https://example.test/4", error_class="http_5000"),
            "a-parse": letter("https://example.test/5", stage="parse", error_class="parse_error"),
            "b-fetch-500": letter("https://example.test/1", source="b", error_class="http_500"),
        }
        store.put(list(entries.values()))
        eid = {name: e.id for name, e in entries.items()}

        def names(found: list[DeadLetter]) -> set[str]:
            back = {v: k for k, v in eid.items()}
            return {back[e.id] for e in found}

        assert names(store.list()) == set(entries)
        assert names(store.list(source="src")) == set(entries) - {"b-fetch-500"}
        assert names(store.list(source="b")) == {"b-fetch-500"}
        assert names(store.list(stage="parse")) == {"a-parse"}
        assert names(store.list(error_class="http_500")) == {
            "a-fetch-500",
            "a-fetch-ex",
            "b-fetch-500",
        }
        assert names(store.list(error_class="retries_exhausted:http_500")) == set()
        assert names(store.list(source="src", stage="fetch", error_class="http_500")) == {
            "a-fetch-500",
            "a-fetch-ex",
        }
        assert names(store.list(error_class="http_50")) == set()
        assert store.list(source="nope") == []
        assert len(store.list(limit=2)) == 2
        assert len(store.list(source="src", limit=100)) == 5

    def test_error_class_filter_is_literal(self, store: DeadLetterStore) -> None:
        store.put(
            [
                letter("https://example.test/1", error_class="httpX500", cause="retries_exhausted"),
                letter("https://example.test/2", error_class="HTTP_500", cause="retries_exhausted"),
            ]
        )
        assert store.list(error_class="http_500") == []

    def test_status_filter(self, store: DeadLetterStore) -> None:
        a, b, c = (letter(f"https://example.test/{n}") for n in "abc")
        store.put([a, b, c])
        assert store.resolve(b.id, "discarded", "fixed upstream")
        assert ids(store.list()) == {a.id, c.id}  # open by default
        assert ids(store.list(status="open")) == {a.id, c.id}
        assert ids(store.list(status="resolved")) == {b.id}
        assert ids(store.list(status=None)) == {a.id, b.id, c.id}
        assert store.list(status="review") == []

    def test_counts_per_status(self, store: DeadLetterStore) -> None:
        store.put([letter(f"https://example.test/{n}") for n in range(4)])
        store.put([letter("https://example.test/x", source="other")])
        store.resolve(letter("https://example.test/0").id, "discarded", "ok")
        assert store.counts() == {"open": 4, "review": 0, "resolved": 1}
        assert store.counts("src") == {"open": 3, "review": 0, "resolved": 1}
        assert store.counts("other") == {"open": 1, "review": 0, "resolved": 0}
        assert store.counts("nobody") == {"open": 0, "review": 0, "resolved": 0}

    def test_census_counts_resolutions_by_kind_and_names_ids(self, store: DeadLetters) -> None:
        urls = [f"https://example.test/{n}" for n in range(8)]
        store.put([letter(url) for url in urls])
        other = letter("https://example.test/x", source="other")
        store.put([other])
        kinds: list[ResolutionKind]
        kinds = ["repaired", "repaired", "discarded", "reviewed", "reenqueued"]
        for url, kind in zip(urls, kinds, strict=False):
            assert store.resolve(letter(url).id, kind, "why")
        assert store.escalate(letter(urls[6]).id, "needs a human")
        census = store.census("src")
        assert census.counts == {
            "open": 2,
            "review": 1,
            "resolved:repaired": 2,
            "resolved:discarded": 1,
            "resolved:reviewed": 1,
            "resolved:reenqueued": 1,
        }
        assert census.ids == {letter(url).id for url in urls}
        assert store.census("other").counts == {"open": 1, "review": 0}
        assert store.census("other").ids == {other.id}
        assert store.census("nobody").counts == {"open": 0, "review": 0}
        assert store.census("nobody").ids == frozenset()

    def test_resolution_kind_is_a_field_beside_the_detail(self, store: DeadLetterStore) -> None:
        entry = letter()
        store.put([entry])
        with pytest.raises(ValueError, match="resolution kind"):
            store.resolve(entry.id, "fixed", "by hand")  # type: ignore[arg-type]  # the test
        assert store.resolve(entry.id, "discarded", "repaired: not really")
        got = store.get(entry.id)
        assert got is not None
        assert (got.resolution_kind, got.resolution) == ("discarded", "repaired: not really")
        assert store.census("src").counts["resolved:discarded"] == 1

    def test_reasons_are_stage_slash_error_class(self, store: DeadLetterStore) -> None:
        store.put(
            [
                letter("https://example.test/1", error_class="http_500"),
                letter("https://example.test/2", error_class="http_500"),
                letter("https://example.test/3", stage="parse", error_class="parse_error"),
                letter("https://example.test/4", error_class="http_404"),
                letter("https://example.test/5", source="other", error_class="timeout"),
            ]
        )
        gone = letter("https://example.test/4", error_class="http_404")
        store.resolve(gone.id, "discarded", "gone")
        store.put(
            [letter("https://example.test/6", error_class="timeout", cause="retries_exhausted")]
        )
        assert store.reasons("src") == {
            "fetch/http_500": 2,
            "parse/parse_error": 1,
            "fetch/retries_exhausted:timeout": 1,
        }
        assert store.reasons("src", status="resolved") == {"fetch/http_404": 1}
        assert store.reasons("src", status=None) == {
            "fetch/http_500": 2,
            "parse/parse_error": 1,
            "fetch/http_404": 1,
            "fetch/retries_exhausted:timeout": 1,
        }
        assert store.reasons("other") == {"fetch/timeout": 1}

    def test_resolve_happens_once(self, store: DeadLetterStore) -> None:
        entry = letter()
        store.put([entry])
        assert store.resolve(entry.id, "discarded", "fixed the parser") is True
        assert store.resolve(entry.id, "discarded", "again") is False
        got = store.get(entry.id)
        assert got is not None
        assert (got.status, got.resolution) == ("resolved", "fixed the parser")
        assert store.resolve("no-such-id", "discarded", "x") is False

    def test_resolved_entry_seen_again_reopens(self, store: DeadLetterStore) -> None:
        entry = letter(attempts=2)
        store.put([entry])
        store.resolve(entry.id, "discarded", "thought it was fixed")
        assert store.put([letter(attempts=1, seen=T0 + 50)]) == 0  # same id: not new
        got = store.get(entry.id)
        assert got is not None
        assert got.status == "open"
        assert (got.resolution, got.resolution_kind) == (None, None)
        assert got.last_seen == T0 + 50
        assert store.counts() == {"open": 1, "review": 0, "resolved": 0}
        assert store.resolve(entry.id, "discarded", "fixed for real") is True

    def test_payload_round_trips(self, store: DeadLetterStore) -> None:
        payload = {
            "title": "Ünïcödé ☃ — 漢字 🚀",
            "nested": {"list": [1, 2.5, None, True, {"deep": ["x"]}], "empty": {}},
            "n": -7,
        }
        entries = [
            letter("https://example.test/dict", payload=payload),
            letter("https://example.test/str", payload="<html>körper</html>"),
            letter("https://example.test/list", payload=[1, "two", {"3": 3}]),
            letter("https://example.test/none", payload=None),
            letter("https://example.test/zero", payload=0),
        ]
        store.put(entries)
        for entry in entries:
            got = store.get(entry.id)
            assert got is not None
            assert got.payload == entry.payload
            assert type(got.payload) is type(entry.payload)

    @pytest.mark.parametrize(
        "payload",
        [
            2**70,
            {"big": 2**70, "neg": -(2**63) - 1, "max": 2**64 - 1, "list": [2**64, -(2**80)]},
            {"float": 1.5e300, "tiny": 5e-324, "nul": "a\u0000b", "ctl": "\u001f\u2028"},
            ["\u0000", 2**70, 1.5e300, "Ünïcödé ☃"],
        ],
        ids=["big-int", "big-ints-nested", "floats-and-nul", "mixed"],
    )
    def test_payload_edge_values_round_trip_exactly(
        self, store: DeadLetterStore, payload: Any
    ) -> None:
        """An int beyond 64 bits comes back as that int (not a float) from every store."""
        entry = letter(payload=payload, failed_expectations=[{"value": 2**70, "nul": "\u0000"}])
        store.put([entry])
        got = store.get(entry.id)
        assert got is not None
        assert got.payload == payload
        assert repr(got.payload) == repr(payload)  # 2**70 == 1.18e21 as floats; reprs differ
        assert got.failed_expectations == entry.failed_expectations
        assert repr(got.failed_expectations) == repr(entry.failed_expectations)
        assert [repr(e.payload) for e in store.list()] == [repr(payload)]

    def test_first_seen_before_filter(self, store: DeadLetterStore) -> None:
        old, new = (
            letter("https://example.test/old"),
            letter("https://example.test/new", seen=T0 + 100),
        )
        store.put([old, new])
        assert ids(store.list(first_seen_before=T0 + 50)) == {old.id}
        assert ids(store.list(first_seen_before=T0)) == set()
        assert ids(store.list(first_seen_before=T0 + 101)) == {old.id, new.id}
        assert len(store.list(first_seen_before=T0 + 101, limit=1)) == 1

    # --- attempts across cycles --------------------------------------------------------------

    def test_a_retried_entry_that_fails_again_adds_its_attempts(
        self, store: DeadLetterStore
    ) -> None:
        """TRIES grows by each cycle's attempts after a retry (issue 27 item 12); within one
        cycle a put seen again (a rerun, a resent call) keeps the largest count, never adds."""
        entry = letter(attempts=1)
        store.put([entry])
        assert store.resolve(entry.id, "reenqueued", "operator retry", requeued=True)
        assert store.put([letter(attempts=1, seen=T0 + 10)]) == 0  # fetched again, failed
        got = store.get(entry.id)
        assert got is not None
        assert (got.status, got.attempts) == ("open", 2)
        store.put([letter(attempts=1, seen=T0 + 11)])  # the same cycle's failure again
        store.put([letter(attempts=1, seen=T0 + 11)])
        got = store.get(entry.id)
        assert got is not None
        assert got.attempts == 2
        store.put([letter(attempts=3, seen=T0 + 12)])  # this cycle went on to 3 attempts
        got = store.get(entry.id)
        assert got is not None
        assert got.attempts == 4  # 1 before the retry + 3 in this cycle
        assert store.resolve(entry.id, "discarded", "tried enough")
        store.put([letter(attempts=2, seen=T0 + 20)])  # seen again after the discard
        got = store.get(entry.id)
        assert got is not None
        assert (got.attempts, len(store.list(status=None))) == (6, 1)

    # --- requeues ---------------------------------------------------------------------------

    def test_requeued_resolution_counts_and_survives_reopening(
        self, store: DeadLetterStore
    ) -> None:
        entry = letter()
        store.put([entry])
        assert store.resolve(entry.id, "reenqueued", "timeout", requeued=True)
        store.put([letter(seen=T0 + 10)])  # failed again
        got = store.get(entry.id)
        assert got is not None
        assert (got.status, got.requeues) == ("open", 1)
        assert store.resolve(entry.id, "reenqueued", "again", requeued=True)
        assert store.resolve(entry.id, "reenqueued", "lost race", requeued=True) is False
        store.put([letter(seen=T0 + 20)])
        assert store.resolve(entry.id, "discarded", "enough")
        got = store.get(entry.id)
        assert got is not None
        assert got.requeues == 2


class TriageClaimsConformance:
    """Triage claims. Mixin: subclasses provide the ``store`` fixture (a fresh, empty store
    that is also a :class:`DeadLetterStore`, to put entries with)."""

    def test_implements_claims_protocol(self, store: DeadLetters) -> None:
        assert isinstance(store, TriageClaims)

    def test_triage_claim_is_exclusive_until_it_expires(self, store: DeadLetters) -> None:
        entry = letter()
        store.put([entry])
        assert store.claim_for_triage(entry.id, "run-a", now=T0, lease_s=60)
        assert store.claim_for_triage(entry.id, "run-b", now=T0 + 1, lease_s=60) is False
        assert store.claim_for_triage(entry.id, "run-a", now=T0 + 2, lease_s=60)  # renew
        assert store.claim_for_triage(entry.id, "run-b", now=T0 + 61, lease_s=60) is False
        assert store.claim_for_triage(entry.id, "run-b", now=T0 + 62, lease_s=60)  # a's expired
        assert store.release_claim(entry.id, "run-a") is False  # no longer a's
        assert store.release_claim(entry.id, "run-b")
        assert store.claim_for_triage(entry.id, "run-a", now=T0 + 63, lease_s=60)
        assert store.counts() == {"open": 1, "review": 0, "resolved": 0}  # claims are no status

    def test_only_open_entries_can_be_claimed(self, store: DeadLetters) -> None:
        done, escalated = letter("https://example.test/d"), letter("https://example.test/e")
        store.put([done, escalated])
        store.resolve(done.id, "discarded", "ok")
        store.escalate(escalated.id, "human")
        for entry in (done, escalated):
            assert store.claim_for_triage(entry.id, "run-a", now=T0, lease_s=60) is False
        assert store.claim_for_triage("no-such-id", "run-a", now=T0, lease_s=60) is False

    def test_resolving_or_reopening_drops_the_claim(self, store: DeadLetters) -> None:
        entry = letter()
        store.put([entry])
        assert store.claim_for_triage(entry.id, "run-a", now=T0, lease_s=600)
        assert store.resolve(entry.id, "repaired", "coerced")
        store.put([letter(seen=T0 + 5)])  # failed again: open and unclaimed
        assert store.claim_for_triage(entry.id, "run-b", now=T0 + 6, lease_s=600)

    def test_concurrent_claims_have_one_winner(self, store: DeadLetters) -> None:
        entries = [letter(f"https://example.test/{n}") for n in range(30)]
        store.put(entries)
        won: dict[str, list[str]] = {"a": [], "b": [], "c": []}

        def work(owner: str) -> None:
            for e in entries:
                if store.claim_for_triage(e.id, owner, now=T0, lease_s=600):
                    won[owner].append(e.id)

        threads = [threading.Thread(target=work, args=(owner,)) for owner in won]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        claimed = [eid for got in won.values() for eid in got]
        assert sorted(claimed) == sorted(e.id for e in entries)


class ReviewQueueConformance:
    """The manual-review queue. Mixin: subclasses provide the ``store`` fixture (a fresh,
    empty store that is also a :class:`DeadLetterStore`)."""

    def test_implements_review_protocol(self, store: DeadLetters) -> None:
        assert isinstance(store, ReviewQueue)

    def test_escalate_happens_once_and_only_for_open_entries(self, store: DeadLetters) -> None:
        a, b = letter("https://example.test/a"), letter("https://example.test/b")
        store.put([a, b])
        assert store.escalate(a.id, "needs a human") is True
        assert store.escalate(a.id, "again") is False
        assert store.resolve(b.id, "discarded", "ok")
        assert store.escalate(b.id, "resolved already") is False
        assert store.escalate("no-such-id", "x") is False
        assert store.counts() == {"open": 0, "review": 1, "resolved": 1}
        assert [e.id for e in store.list(status="review")] == [a.id]
        store.put([letter("https://example.test/a", seen=T0 + 5)])  # stays in review
        assert store.counts()["review"] == 1

    def test_vanished_reviewer_is_taken_over_and_resolved_once(self, store: DeadLetters) -> None:
        entry = letter(payload={"x": 1})
        store.put([entry])
        assert store.escalate(entry.id, "unknown error")
        ((message_id, taken),) = store.take_for_review("src", "alice")
        assert taken.to_dict() == {**entry.to_dict(), "status": "review"}
        assert store.take_for_review("src", "bob") == []  # alice holds it
        assert store.claim_stale_reviews("src", "bob", idle_ms=60_000) == []  # not stale yet
        time.sleep(0.15)  # alice vanished
        ((claimed_id, claimed),) = store.claim_stale_reviews("src", "bob", idle_ms=100)
        assert (claimed_id, claimed.id) == (message_id, entry.id)
        assert store.finish_review(claimed_id, entry.id, "reviewed", "upstream fixed") is True
        assert store.finish_review(claimed_id, entry.id, "reviewed", "again") is False
        got = store.get(entry.id)
        assert got is not None
        assert (got.status, got.resolution) == ("resolved", "upstream fixed")
        assert store.take_for_review("src", "carol") == []
        assert store.claim_stale_reviews("src", "carol", idle_ms=0) == []

    def test_reviewers_never_get_the_same_entry(self, store: DeadLetters) -> None:
        entries = [letter(f"https://example.test/{n}") for n in range(30)]
        store.put(entries)
        for e in entries:
            assert store.escalate(e.id, "check")
        got: dict[str, list[str]] = {"alice": [], "bob": [], "carol": []}

        def work(name: str) -> None:
            while batch := store.take_for_review("src", name, count=3):
                got[name] += [e.id for _, e in batch]

        threads = [threading.Thread(target=work, args=(name,)) for name in got]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        taken = [eid for ids in got.values() for eid in ids]
        assert sorted(taken) == sorted(e.id for e in entries)

    def test_resolving_an_entry_in_review_drops_its_review(self, store: DeadLetters) -> None:
        waiting, held = letter("https://example.test/w"), letter("https://example.test/h")
        store.put([waiting, held])
        store.escalate(held.id, "x")
        ((message_id, _),) = store.take_for_review("src", "alice")
        store.escalate(waiting.id, "y")
        assert store.resolve(waiting.id, "discarded", "fixed by a rerun")
        assert store.resolve(held.id, "discarded", "fixed by a rerun")
        assert store.take_for_review("src", "bob") == []
        assert store.claim_stale_reviews("src", "bob", idle_ms=0) == []
        assert store.finish_review(message_id, held.id, "reviewed", "late") is False

    def test_a_reopened_entry_is_reviewed_anew(self, store: DeadLetters) -> None:
        entry = letter()
        store.put([entry])
        store.escalate(entry.id, "first")
        ((first, _),) = store.take_for_review("src", "alice")
        assert store.resolve(entry.id, "discarded", "fixed")
        store.put([letter(seen=T0 + 10)])
        assert store.escalate(entry.id, "second")
        ((second, _),) = store.take_for_review("src", "bob")
        assert second != first
        assert store.finish_review(first, entry.id, "reviewed", "stale review") is False
        assert store.finish_review(second, entry.id, "reviewed", "fixed for real") is True

    def test_finish_review_refuses_a_message_about_another_entry(self, store: DeadLetters) -> None:
        a, b = letter("https://example.test/a"), letter("https://example.test/b")
        store.put([a, b])
        store.escalate(a.id, "x")
        store.escalate(b.id, "x")
        (message_a, _), (message_b, _) = store.take_for_review("src", "alice", count=2)
        with pytest.raises(ValueError, match="not"):
            store.finish_review(message_a, b.id, "reviewed", "wrong")
        assert store.counts()["review"] == 2
        assert store.finish_review(message_b, b.id, "reviewed", "right") is True

    def test_take_for_review_waits_for_work(self, store: DeadLetters) -> None:
        entry = letter()
        store.put([entry])
        assert store.take_for_review("src", "alice", block_ms=100) == []
        timer = threading.Timer(0.1, store.escalate, args=(entry.id, "later"))
        timer.start()
        try:
            ((_, got),) = store.take_for_review("src", "alice", block_ms=10_000)
        finally:
            timer.join()
        assert got.id == entry.id

    def test_each_source_has_its_own_queue(self, store: DeadLetters) -> None:
        mine, theirs = letter("https://example.test/m"), letter("https://x.test/t", source="b")
        store.put([mine, theirs])
        store.escalate(theirs.id, "b's problem")
        store.escalate(mine.id, "mine")
        ((_, got),) = store.take_for_review("src", "alice", count=5)
        assert got.id == mine.id
        ((_, got),) = store.take_for_review("b", "alice", count=5)
        assert got.id == theirs.id
        time.sleep(0.02)
        assert [e.id for _, e in store.claim_stale_reviews("b", "bob", idle_ms=1)] == [theirs.id]

    def test_put_back_hands_the_review_to_the_next_reviewer(self, store: DeadLetters) -> None:
        entry, other = letter(payload={"x": 1}), letter("https://example.test/o")
        store.put([entry, other])
        store.escalate(entry.id, "check")
        ((message_id, _),) = store.take_for_review("src", "alice")
        with pytest.raises(ValueError, match="not"):
            store.put_back(message_id, other.id)
        assert store.put_back(message_id, entry.id) is True
        got = store.get(entry.id)
        assert got is not None and got.status == "review"
        ((again, taken),) = store.take_for_review("src", "bob")
        assert taken.id == entry.id
        assert store.put_back(message_id, entry.id) is (again == message_id)
        store.take_for_review("src", "carol")
        assert store.finish_review(again, entry.id, "discarded", "spam") is True
        assert store.put_back(again, entry.id) is False  # finished: nothing to hand back
        assert store.take_for_review("src", "dave") == []

    def test_put_back_moves_the_entry_behind_the_others(self, store: DeadLetters) -> None:
        """A reviewer who puts an entry back gets the next one, not the same one again."""
        entries = [letter(f"https://example.test/{n}") for n in "abc"]
        store.put(entries)
        for e in entries:
            assert store.escalate(e.id, "check")
        order = []
        for _ in range(4):
            ((message_id, taken),) = store.take_for_review("src", "alice")
            order.append(taken.id)
            assert store.put_back(message_id, taken.id) is True
        a, b, c = (e.id for e in entries)
        assert order == [a, b, c, a]

    def test_an_entry_is_taken_by_its_id_out_of_turn(self, store: DeadLetters) -> None:
        entries = [letter(f"https://example.test/{n}") for n in "abcd"]
        elsewhere = letter("https://x.test/e", source="other")
        store.put([*entries, elsewhere])
        for e in [*entries, elsewhere]:
            assert store.escalate(e.id, "check")
        a, b, c, d = (e.id for e in entries)
        ((message_id, got),) = store.take_entry_for_review("src", c, "alice")
        assert got.id == c and got.status == "review"
        assert store.take_entry_for_review("src", c, "bob") == []  # alice holds it
        ((again, _),) = store.take_entry_for_review("src", c, "alice")  # her own, still
        assert again == message_id
        # the others keep their order and nobody else is handed c
        assert [e.id for _, e in store.take_for_review("src", "bob", count=10)] == [a, b, d]
        assert store.take_entry_for_review("src", elsewhere.id, "alice") == []  # other source
        assert store.take_entry_for_review("src", "no-such-id", "alice") == []
        time.sleep(0.05)
        assert store.take_entry_for_review("src", c, "carol", idle_ms=60_000) == []
        ((taken_over, _),) = store.take_entry_for_review("src", c, "carol", idle_ms=10)
        assert store.finish_review(taken_over, c, "discarded", "spam") is True
        assert store.take_entry_for_review("src", c, "carol", idle_ms=0) == []  # resolved
        open_one = letter("https://example.test/open")
        store.put([open_one])
        assert store.take_entry_for_review("src", open_one.id, "carol") == []  # not escalated

    def test_an_entry_taken_by_id_is_put_back_and_handed_out_in_turn(
        self, store: DeadLetters
    ) -> None:
        entries = [letter(f"https://example.test/{n}") for n in "abc"]
        store.put(entries)
        for e in entries:
            assert store.escalate(e.id, "check")
        a, b, c = (e.id for e in entries)
        ((message_id, _),) = store.take_entry_for_review("src", b, "alice")
        assert store.put_back(message_id, b) is True
        assert [e.id for _, e in store.take_for_review("src", "bob", count=10)] == [a, c, b]


class DeadLetterConformance(StoreConformance, TriageClaimsConformance, ReviewQueueConformance):
    """All three protocols (both backends implement them all)."""

    def test_implements_every_part(self, store: DeadLetters) -> None:
        assert isinstance(store, DeadLetters)
