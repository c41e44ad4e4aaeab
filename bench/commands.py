"""Everyday commands: wall and CPU of each, beside the bare interpreter and, optionally, another
checkout of Collector, in one run.

    .venv/bin/python bench/commands.py [--repeat 5] [--base REF]

Each command runs in a fresh process, as a user types it, against a small source in a scratch
folder (no Prefect server is needed: none of these commands talks to the API). With ``--base``
the same commands also run from a ``git worktree`` of REF (same venv, ``PYTHONPATH`` pointing at
it), alternating with this checkout so both see the same load; each row then gives the ratio
this / base. ``python -c pass`` is the floor every command pays.

``validate (suite, first)`` is a GX suite seen for the first time (an empty cache folder each
time); ``validate (suite, again)`` is the everyday case: the suite unchanged since the last check.

``run (suite, every item fresh)`` is the everyday scheduled rerun: a source with a GX suite whose
50 pages (a local site in this process) were all fetched by the first, untimed run, so nothing
is due. It talks to Prefect, so it uses the background local server a user's first `collector
run` starts (one per checkout's interpreter, left running, as after ``collector demo``); each
checkout has a folder of its own for this source (frontier schemas may differ between them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from collector.demo.site import FaultSite  # noqa: E402
from tests.helpers import PRICE_EXPECTATIONS, write_source, write_suite  # noqa: E402

COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "--help": ["-m", "flows.cli", "--help"],
    "schema": ["-m", "flows.cli", "schema"],
    "validate (no suite)": ["-m", "flows.cli", "validate", "{plain}"],
    "validate (suite, first)": ["-m", "flows.cli", "validate", "{suited}"],
    "validate (suite, again)": ["-m", "flows.cli", "validate", "{suited}"],
    "status": ["-m", "flows.cli", "status", "{plain}"],
    "deadletters list": ["-m", "flows.cli", "deadletters", "list", "{plain}"],
    "run (suite, every item fresh)": ["-m", "flows.cli", "run", "{fresh}"],
}


def _sources(folder: Path) -> dict[str, str]:
    (folder / "plain").mkdir()
    plain = write_source(
        folder / "plain", seeds={"template": "http://127.0.0.1:9/{i}.json", "range": [0, 1000]}
    )
    (folder / "suited").mkdir()
    write_suite(folder / "suited" / "suite.json", PRICE_EXPECTATIONS)
    suited = write_source(
        folder / "suited",
        seeds={"template": "http://127.0.0.1:9/{i}.json", "range": [0, 1000]},
        validation={"suite": "suite.json"},
    )
    return {"plain": str(plain), "suited": str(suited)}


def _fresh_source(folder: Path, site: FaultSite) -> str:
    """A suited source of the site's 50 pages (fetched once, untimed, then all fresh)."""
    folder.mkdir()
    write_suite(folder / "suite.json", PRICE_EXPECTATIONS)
    return str(
        write_source(
            folder,
            seeds={"urls": [site.url(f"/items/{i}.json") for i in range(50)]},
            validation={"suite": "suite.json"},
        )
    )


def _once(name: str, argv: list[str], tree: Path, scratch: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if argv[2:3] == ["run"]:  # the background local server, as a user's `collector run`
        env.pop("PREFECT_API_URL")
    cache = scratch / "cache" / tree.name
    if name == "validate (suite, first)":
        cache = Path(tempfile.mkdtemp(dir=scratch))
    env["COLLECTOR_CACHE_DIR"] = str(cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, *argv], cwd=scratch, env=env, capture_output=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed in {tree}:\n{done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _worktree(ref: str, scratch: Path) -> Path:
    tree = scratch / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--base", help="a git ref to compare with (run from a worktree)")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="collector-bench-commands-") as folder,
        FaultSite() as site,
    ):
        scratch = Path(folder)
        shared = _sources(scratch)
        trees = {"this": ROOT}
        if args.base:
            trees["base"] = _worktree(args.base, scratch)
        paths = {
            label: shared | {"fresh": _fresh_source(scratch / f"fresh-{label}", site)}
            for label in trees
        }
        try:
            for label, tree in trees.items():  # bytecode written once, the pages fetched once
                for name, argv in COMMANDS.items():
                    _once(name, [a.format(**paths[label]) for a in argv], tree, scratch)
            times: dict[tuple[str, str], list[tuple[float, float]]] = {}
            for _ in range(args.repeat):
                for name, argv in COMMANDS.items():
                    for label, tree in trees.items():  # alternating: the same load for both
                        argv_ = [a.format(**paths[label]) for a in argv]
                        times.setdefault((name, label), []).append(
                            _once(name, argv_, tree, scratch)
                        )
        finally:
            if "base" in trees:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(trees["base"])],
                    capture_output=True,
                )
    load = os.getloadavg()
    print(
        f"load 1/5/15 min: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; medians of {args.repeat}"
    )
    head = "| command | wall s | CPU s |"
    if "base" in trees:
        head += f" base ({args.base}) wall s | base CPU s | wall this/base |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    rows = []
    for name in COMMANDS:
        wall, cpu = (statistics.median(x) for x in zip(*times[(name, "this")], strict=True))
        row = f"| {name} | {wall:.2f} | {cpu:.2f} |"
        record = {"command": name, "wall_s": wall, "cpu_s": cpu}
        if "base" in trees:
            bwall, bcpu = (statistics.median(x) for x in zip(*times[(name, "base")], strict=True))
            row += f" {bwall:.2f} | {bcpu:.2f} | {wall / bwall:.2f} |"
            record |= {"base_wall_s": bwall, "base_cpu_s": bcpu}
        print(row)
        rows.append(record)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
