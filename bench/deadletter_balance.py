"""What the dead-letter balance costs: ``tally`` against the archive's size, side by side.

    .venv/bin/python bench/deadletter_balance.py [--n 20000 --n 100000] [--payload 300]

For each N: a SQLite store with its archive gets N record dead letters (``--payload`` bytes of
record each, put in batches of 500), a quarter resolved; then ``tally`` runs three times and the
best time is printed with its two parts, the archive read (``JsonlArchive.quarantined_ids``) and
the store's ``census``, as milliseconds and microseconds per entry, plus the archive's size.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.deadletter.archive import JsonlArchive  # noqa: E402
from collector.deadletter.base import DeadLetter  # noqa: E402
from collector.deadletter.sqlite import SqliteDeadLetterStore  # noqa: E402
from collector.recovery.triage import tally  # noqa: E402


def best(call: object, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times)


def measure(n: int, payload: int, folder: Path) -> None:
    archive_path = folder / f"dl-{n}.jsonl"
    store = SqliteDeadLetterStore(folder / f"dl-{n}.db", archive=archive_path)
    try:
        for start in range(0, n, 500):
            store.put([
                DeadLetter(source="bench", url=f"https://example.test/{i}", stage="validate",
                           error_class="schema", message="price out of range", attempts=1,
                           first_seen=1.0, last_seen=1.0, record_key=str(i),
                           payload={"id": i, "blob": "x" * payload})
                for i in range(start, min(start + 500, n))
            ])  # fmt: skip
        for i in range(0, n, 4):
            entry = DeadLetter("bench", f"https://example.test/{i}", "validate", "schema", "", 1,
                               1.0, 1.0, record_key=str(i))  # fmt: skip
            store.resolve(entry.id, "repaired", "x")
        archive = JsonlArchive(archive_path)
        assert tally(store, "bench", archive).balanced
        whole = best(lambda: tally(store, "bench", archive))
        read = best(lambda: archive.quarantined_ids("bench"))
        census = best(lambda: store.census("bench"))
        size = sum(p.stat().st_size for p in archive.files()) / 2**20
        print(
            f"n={n:>8,}  archive {size:7.1f} MiB  tally {whole * 1e3:8.1f} ms"
            f" ({whole / n * 1e6:5.1f} us/entry)  archive read {read * 1e3:8.1f} ms"
            f"  census {census * 1e3:7.1f} ms"
        )
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="entries (repeatable)")
    parser.add_argument("--payload", type=int, default=300, help="bytes of record per entry")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for n in args.n or [20_000, 100_000]:
            measure(n, args.payload, Path(folder))


if __name__ == "__main__":
    main()
