"""The demo: a source that meets every kind of fault the demo site can produce.

``write_demo_source(folder, base_url)`` writes ``demo.yaml``, ``seeds.txt`` and
``suite.json`` into ``folder``; what each fault URL should end as is documented next to it, and
the integration tests assert exactly these outcomes.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

__all__ = ["DEMO_ITEMS", "EXPECTED", "FAULT_PATHS", "write_demo_source"]

DEMO_ITEMS = 120  # healthy /items/{i}.json pages from the template

# path -> what it should end as after one run of the demo source
FAULT_PATHS: dict[str, str] = {
    "/items/1001.json?status=429&retry_after=1": "stored (after honouring Retry-After: 1)",
    "/items/1002.json?status=503&times=2": "stored (after two 503s, retried with backoff)",
    "/items/1003.json?status=503&times=2&retry_after=0": "stored (503 burst with Retry-After: 0)",
    "/items/1004.json?delay=5": "dead letter: timeout (no answer within its 1 s read timeout)",
    "/items/1005.json?malformed=1": "dead letter: parse_error (truncated JSON, never retried)",
    "/items/1006.json?invalid=1": "dead letter: schema (price -1 and name null fail the suite)",
    "/missing/1007.json": "dead letter: http_404 (fetched once, never retried)",
    "/items/1008.json?redirect=/items/2008.json": "stored (record 2008, via a 302 redirect)",
    "/items/1009.json?status=500&times=-1": "dead letter: http_500 (retries exhausted)",
}

EXPECTED = {
    "discovered": DEMO_ITEMS + len(FAULT_PATHS),
    "stored": DEMO_ITEMS + 4,
    "dead_lettered": 5,
    "fresh_skipped": 0,
    "expired": 0,
    "queued": 0,
}

SUITE = {
    "name": "demo-items",
    "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "name"}},
        {
            "type": "expect_column_values_to_be_between",
            "kwargs": {"column": "price", "min_value": 0, "max_value": 100000},
        },
        {
            "type": "expect_column_values_to_be_in_set",
            "kwargs": {"column": "category", "value_set": ["books", "tools", "games", "food"]},
        },
    ],
}


def write_demo_source(folder: Path, base_url: str) -> Path:
    """Write the demo source for a demo site at ``base_url``; returns the source file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "seeds.txt").write_text(
        "# fault URLs: see collector/demo/scenario.py for what each should end as\n"
        + "".join(f"{base_url}{path}\n" for path in FAULT_PATHS),
        encoding="utf-8",
    )
    (folder / "suite.json").write_text(json.dumps(SUITE, indent=2), encoding="utf-8")
    source = {
        "name": "demo-items",
        "description": "Items from the local demo site, with deliberate faults.",
        "seeds": {
            "template": f"{base_url}/items/{{i}}.json",
            "range": [0, DEMO_ITEMS],
            "file": "seeds.txt",
        },
        "record": {"key": "id"},
        "ttl": {
            "default_fresh_s": 3600,
            "rules": [{"pattern": r"/items/\d+\.json$", "fresh_s": 1800}],
            "queue_ttl_s": 3600,
            "http_timeout_s": 1.0,
            "request_deadline_s": 1.5,
            "batch_timeout_s": 60,
            "lease_s": 120,
        },
        "priority": {
            "class": "normal",
            "weight": 5,
            "rules": [{"prefix": base_url + "/missing/", "weight": 1}],
        },
        "retry": {
            "profile": "exponential",
            "base_s": 0.2,
            "cap_s": 2.0,
            "max_attempts": 3,
            "max_total_s": 60,
            "max_inline_delay_s": 2.5,
        },
        "limits": {
            "concurrency": 16,
            "per_domain_concurrency": 16,
            "per_domain_rate": "500/second",
        },
        "validation": {"suite": "suite.json"},
        "sink": {"type": "jsonl", "path": "out"},
        "state_dir": ".collector",
        "allow_private_networks": True,
    }
    path = folder / "demo.yaml"
    path.write_text(
        "# Demo source written by `collector demo` (see collector/demo/scenario.py).\n"
        + yaml.safe_dump(source, sort_keys=False),
        encoding="utf-8",
    )
    return path
