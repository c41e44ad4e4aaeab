"""Sink write cost: PostgresSink vs JsonlSink side by side, in one run.

    .venv/bin/python bench/postgres_sink.py [--n 50000] [--batch 200]

Starts its own Postgres cluster on a free port (tests/servers.py; fsync off, as in the tests,
so this measures the statement, not the disk) and writes N records of ~300 bytes in batches, to
each sink, three times: new keys (insert), the same records again (a rerun: nothing written,
only the fence moves), and changed records under a newer token (update). Prints microseconds
per record for each pass and the Postgres/JSONL ratio. JSONL fsyncs each batch; Postgres
commits each batch (one statement, one round trip, one transaction).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.sinks.base import Sink, SinkRecord  # noqa: E402
from collector.sinks.jsonl import JsonlSink  # noqa: E402
from collector.sinks.postgres import PostgresSink  # noqa: E402
from tests.servers import PostgresServer  # noqa: E402


def _record(i: int, version: int) -> dict[str, object]:
    return {
        "id": i,
        "name": f"item {i}",
        "price": i * 1.25,
        "version": version,
        "tags": ["a", "b", "c"],
        "text": "x" * 200,
    }


def records(n: int, version: int) -> list[SinkRecord]:
    return [
        SinkRecord(str(i), _record(i, version), f"https://example.test/items/{i}.json")
        for i in range(n)
    ]


def run_pass(sink: Sink, data: list[SinkRecord], *, batch: int, token0: int) -> tuple[float, int]:
    written = 0
    started = time.perf_counter()
    for n, at in enumerate(range(0, len(data), batch)):
        token = token0 + n
        result = sink.write(data[at : at + batch], token=token, batch_id=f"b{token}")
        written += result.written
    return time.perf_counter() - started, written


def bench(name: str, sink: Sink, n: int, batch: int) -> dict[str, float]:
    first, second = records(n, 1), records(n, 2)
    out = {}
    for label, data, token0, expect in (
        ("insert", first, 1, n),
        ("rerun", first, 1_000_000, 0),
        ("update", second, 2_000_000, n),
    ):
        seconds, written = run_pass(sink, data, batch=batch, token0=token0)
        assert written == expect, (name, label, written)
        out[label] = seconds / n * 1e6
    assert sink.count() == n
    sink.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, PostgresServer() as server:
        results = {
            "jsonl": bench("jsonl", JsonlSink(folder, source="bench"), args.n, args.batch),
            "postgres": bench(
                "postgres",
                PostgresSink(server.create_database("bench"), source="bench"),
                args.n,
                args.batch,
            ),
        }
    print(f"{args.n} records of ~300 bytes, batches of {args.batch}; us per record")
    print(f"{'pass':8} {'jsonl':>8} {'postgres':>9} {'pg/jsonl':>9}")
    for label in ("insert", "rerun", "update"):
        j, p = results["jsonl"][label], results["postgres"][label]
        print(f"{label:8} {j:8.1f} {p:9.1f} {p / j:9.2f}")


if __name__ == "__main__":
    main()
