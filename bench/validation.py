"""GX time per batch and per record for 500-record batches: one GX call per batch (before) vs
several waiting batches validated together (after), side by side in one run.

    .venv/bin/python bench/validation.py [--batch-size 500] [--batches 16] [--together 8]

Uses the demo's 4-expectation suite (the one bench/throughput.py runs) on records shaped like
the throughput pages, ~1% of them bad. Three measurements, each the median of ``--repeat``:

1. in-process, one ``SuiteValidator.validate`` per batch (what every batch paid before);
2. in-process, ``validate_many`` of ``--together`` batches (one GX call when exact; default
   4, what the collect flow sends, and 8);
3. through the validation worker process as the collect flow uses it: batches submitted one
   at a time (``linger_s=0``, each waits for the previous), then all at once (the first
   ``--together`` value per round trip).

Prints JSON: ms per batch, us per record, GX calls, and the ratios. Like every figure on this
shared 2-core box it is noisy: read the ratios, and the load average printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector import defaults  # noqa: E402
from collector.demo.scenario import SUITE  # noqa: E402
from collector.settle.validation import SuiteValidator  # noqa: E402
from collector.settle.validation_worker import ValidationWorker  # noqa: E402

CATEGORIES = ["books", "tools", "games", "food"]


def batch(size: int, offset: int) -> list[dict[str, Any]]:
    records = []
    for i in range(offset, offset + size):
        record: dict[str, Any] = {
            "id": i,
            "name": f"item {i}",
            "price": round(1 + (i * 37 % 1000) / 10, 2),
            "category": CATEGORIES[i % 4],
        }
        if i % 100 == 7:
            record["price"] = -1  # ~1% bad rows
        records.append(record)
    return records


def median_ms(samples: list[float]) -> float:
    return round(1000 * statistics.median(samples), 2)


def figures(seconds_per_batch: float, size: int, calls_per_batch: float) -> dict[str, float]:
    return {
        "ms_per_batch": round(1000 * seconds_per_batch, 2),
        "us_per_record": round(1e6 * seconds_per_batch / size, 1),
        "gx_calls_per_batch": round(calls_per_batch, 3),
    }


def in_process(
    suite: Path, size: int, batches: int, together: list[int], repeat: int
) -> dict[str, Any]:
    validator = SuiteValidator(suite)
    validator.validate(batch(size, 0))  # GX import and set-up, not measured
    data = [batch(size, n * size) for n in range(batches)]
    one: list[float] = []
    many: dict[int, list[float]] = {k: [] for k in together}
    calls: dict[int, float] = {}
    for _ in range(repeat):
        started = time.perf_counter()
        for records in data:
            validator.validate(records)
        one.append((time.perf_counter() - started) / batches)
        for k in together:
            before = validator.gx_calls
            started = time.perf_counter()
            for n in range(0, batches, k):
                validator.validate_many(data[n : n + k])
            many[k].append((time.perf_counter() - started) / batches)
            calls[k] = (validator.gx_calls - before) / batches
    base = statistics.median(one)
    report: dict[str, Any] = {"per_batch_call": figures(base, size, 1.0)}
    for k in together:
        after = statistics.median(many[k])
        report[f"{k}_batches_per_call"] = figures(after, size, calls[k])
        report[f"{k}_batches_speedup"] = round(base / after, 2)
    return report


async def through_worker(suite: Path, size: int, batches: int, together: int) -> dict[str, Any]:
    data = [batch(size, n * size) for n in range(batches)]
    worker = ValidationWorker(suite, linger_s=0, max_batches=together)
    try:
        await worker.validate(data[0])  # waits for the worker's GX import
        worker.calls = 0
        started = time.perf_counter()
        for records in data:
            await worker.validate(records)  # one at a time: one round trip, one GX call each
        one = (time.perf_counter() - started) / batches
        one_calls = worker.calls / batches
        worker.calls = 0
        started = time.perf_counter()
        await asyncio.gather(*(worker.validate(records) for records in data))
        many = (time.perf_counter() - started) / batches
        many_calls = worker.calls / batches
    finally:
        await worker.aclose()
    return {
        "one_at_a_time": figures(one, size, one_calls),
        "submitted_together": figures(many, size, many_calls),
        "speedup": round(one / many, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument(
        "--together", type=int, nargs="+", default=[defaults.VALIDATION_MAX_BATCHES, 8]
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    folder = Path(tempfile.mkdtemp(prefix="collector-bench-gx-"))
    suite = folder / "suite.json"
    suite.write_text(json.dumps(SUITE), encoding="utf-8")
    report = {
        "batch_size": args.batch_size,
        "batches": args.batches,
        "suite_expectations": len(SUITE["expectations"]),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "in_process": in_process(suite, args.batch_size, args.batches, args.together, args.repeat),
        "worker_process": asyncio.run(
            through_worker(suite, args.batch_size, args.batches, args.together[0])
        ),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
