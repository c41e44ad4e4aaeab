"""A module the warm-start tests run through the shim (``python -m flows.warmstart
tests.warm_target ACTION...``) instead of Prefect's engine: what it does is its arguments.

    exit N          exit with N
    raise           an uncaught exception (exit 1)
    interrupt       an uncaught KeyboardInterrupt (the interpreter ends by SIGINT)
    kill N          kill itself with signal N
    wait PATH       write PATH (pid, parent, cwd, a variable, argv) and wait for SIGTERM; on it
                    write PATH.term and exit 0
    sleep PATH      write PATH and sleep (no handler: SIGTERM ends it by signal)
    atexit PATH     register an atexit handler that writes PATH, exit 0
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def _write(path: str) -> None:
    facts = {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "argv": sys.argv,
             "probe": os.environ.get("WARM_PROBE"), "sid": os.getsid(0),
             "ignored_hup": signal.getsignal(signal.SIGHUP) == signal.SIG_IGN}  # fmt: skip
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(facts, out)
    os.replace(path + ".tmp", path)


def main(args: list[str]) -> int:
    action = args[0]
    if action == "exit":
        print(f"exiting with {args[1]}", flush=True)
        return int(args[1])
    if action == "raise":
        raise RuntimeError("raised on purpose")
    if action == "interrupt":
        raise KeyboardInterrupt
    if action == "kill":
        os.kill(os.getpid(), int(args[1]))
        time.sleep(5)
        return 99
    if action == "wait":
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        _write(args[1])
        while not stop:
            time.sleep(0.05)
        with open(args[1] + ".term", "w", encoding="utf-8") as out:
            out.write("term\n")
        return 0
    if action == "sleep":
        _write(args[1])
        time.sleep(600)
        return 0
    if action == "atexit":
        import atexit
        from pathlib import Path

        atexit.register(lambda: Path(args[1]).write_text("atexit\n", encoding="utf-8"))
        return 0
    raise SystemExit(f"unknown action {action}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
