"""Cold start: a small `collector run` on the embedded default vs importing the collect flow.

    .venv/bin/python bench/cold_start.py [--urls 10] [--repeat 3]

Measured in one run, side by side, on the embedded default (no PREFECT_API_URL, a fresh
PREFECT_HOME), against a local site of small JSON pages:

1. ``python -c "import flows.collect"``: the floor, what any command that runs a flow pays;
2. the first ``collector run`` (starts the local Prefect server in the background);
3. the second and later consecutive ``collector run`` of the same source (reuse the server);
4. the same run with ``COLLECTOR_LOCAL_SERVER=0``: Prefect's own temporary server per process
   (what every run cost before the background server).

Prints each median and the ratio run / import (target: the second run <= 2.5 x the import).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers import write_source  # noqa: E402
from tests.worker_site import WorkerSite  # noqa: E402


def _timed(args: list[str], env: dict[str, str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{args} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--urls", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, WorkerSite() as site:
        folder = Path(tmp)
        home = folder / "prefect-home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
        env.update(PREFECT_HOME=str(home), PYTHONPATH=str(ROOT))
        collector = [sys.executable, "-m", "flows.cli"]

        def source(n: int) -> Path:
            sub = folder / f"s{n}"
            sub.mkdir()
            seeds = {"template": site.url("/items/{i}.json"), "range": [0, args.urls]}
            return write_source(sub, name=f"cold-{n}", seeds=seeds)

        imports = [
            _timed([sys.executable, "-c", "import flows.collect"], env) for _ in range(args.repeat)
        ]
        first = _timed([*collector, "run", str(source(0))], env)
        later = [_timed([*collector, "run", str(source(i + 1))], env) for i in range(args.repeat)]
        subprocess.run([*collector, "server", "stop"], cwd=ROOT, env=env, capture_output=True)
        temporary = [
            _timed(
                [*collector, "run", str(source(100 + i))], {**env, "COLLECTOR_LOCAL_SERVER": "0"}
            )
            for i in range(args.repeat)
        ]

    load = os.getloadavg()[0]
    floor = statistics.median(imports)
    rows = [
        ("import flows.collect", floor),
        ("first collector run (starts the server)", first),
        ("second+ collector run (reuses it)", statistics.median(later)),
        ("collector run, temporary server per run", statistics.median(temporary)),
    ]
    print(f"{args.urls} URLs, median of {args.repeat}, load {load:.1f}")
    for name, seconds in rows:
        print(f"  {name:42} {seconds:6.2f} s   {seconds / floor:5.2f} x import")


if __name__ == "__main__":
    main()
