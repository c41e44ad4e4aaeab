"""``python -m collector.ops.metrics_server --port N``: the summed metrics of a process worker.

A Prefect process worker runs each flow run in a process of its own, which exits with the run.
With ``PROMETHEUS_MULTIPROC_DIR`` set on the worker, those processes write their values to
files there (prometheus_client's multiprocess mode), and this server, started beside the worker
(infra/compose.yaml, the Helm sidecar), serves their sum: counters stay cumulative across flow
runs, gauges keep the most recent value written. A module of its own so that ``-m`` does not
import :mod:`collector.ops.metrics` a second time (its metrics would register twice).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from collector.ops.metrics import serve

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the multiprocess sum until killed; exit 2 when no folder is configured."""
    import os

    parser = argparse.ArgumentParser(prog="python -m collector.ops.metrics_server")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--addr", default="0.0.0.0")
    args = parser.parse_args(argv)
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        parser.error("PROMETHEUS_MULTIPROC_DIR is not set (the folder the flow runs write to)")
    _, thread = serve(args.port, addr=args.addr)
    thread.join()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
