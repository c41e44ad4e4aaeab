"""What exactness costs: collector._json against bare orjson on JSONL-sink lines.

    .venv/bin/python bench/json_codec.py [--records 20000]

Encodes and decodes the same records (a typical parsed page with its ``_collector`` metadata)
with bare orjson (fast, inexact beyond 64 bits) and with the codec every store uses, side by side,
and prints each as records per second and the codec's ratio to orjson. The digest is the sinks'
(sorted keys) encoding. "parse page" is the fetch path (collector.settle.parse): a page of 50
such records (no ``_collector``), read with bare orjson (before issue 24) and with
``_json.parse``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson

from collector import _json


def record(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "title": f"Item {i}: Ünïcödé ☃ product title that is not very short",
        "price": 19.99 + i / 100,
        "tags": ["a", "b", "c"],
        "in_stock": i % 3 == 0,
        "seller": {"name": "shop", "rating": 4.5, "reviews": 1234},
        "_collector": {
            "key": str(i),
            "token": 42,
            "batch": "5f0c1e2a9d",
            "url": f"https://example.test/items/{i}",
            "stored_at": 1_700_000_000.123,
        },
    }


def side_by_side(
    runs: int, bare: Callable[[], object], codec: Callable[[], object]
) -> tuple[float, float]:
    """Best time of each, the two run alternately so that a busy machine slows both alike."""
    best = [float("inf"), float("inf")]
    for _ in range(runs):
        for i, work in enumerate((bare, codec)):
            started = time.perf_counter()
            work()
            best[i] = min(best[i], time.perf_counter() - started)
    return best[0], best[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    records = [record(i) for i in range(args.records)]
    lines = [orjson.dumps(r) for r in records]
    sort = orjson.OPT_SORT_KEYS
    pages = [
        orjson.dumps(
            [{k: v for k, v in r.items() if k != "_collector"} for r in records[i : i + 50]]
        )
        for i in range(0, len(records), 50)
    ]
    cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (
            "encode",
            lambda: [orjson.dumps(r) for r in records],
            lambda: [_json.dumps(r) for r in records],
        ),
        (
            "encode sorted (digest)",
            lambda: [orjson.dumps(r, option=sort) for r in records],
            lambda: [_json.dumps(r, sort_keys=True) for r in records],
        ),
        (
            "decode",
            lambda: [orjson.loads(b) for b in lines],
            lambda: [_json.loads(b) for b in lines],
        ),
        (
            "parse page (50 rec.)",
            lambda: [orjson.loads(b) for b in pages],
            lambda: [_json.parse(b) for b in pages],
        ),
    ]
    print(f"{args.records:,} records, best of {args.runs} runs")
    print(f"{'':24} {'orjson rec/s':>14} {'codec rec/s':>14} {'codec/orjson':>13}")
    for name, bare, codec in cases:
        t_bare, t_codec = side_by_side(args.runs, bare, codec)
        n = args.records
        print(f"{name:24} {n / t_bare:14,.0f} {n / t_codec:14,.0f} {t_bare / t_codec:13.2f}")


if __name__ == "__main__":
    main()
