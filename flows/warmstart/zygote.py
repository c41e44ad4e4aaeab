"""The zygote: an interpreter that imported a flow run's code once and forks a run per request.

Started by a shim that found none (``python -m flows.warmstart.zygote KEY``: detached, its own
session, stdout and stderr to ``<KEY>.log``, the shim's environment without the per-run
variables). In order:

1. Takes ``<KEY>.lock`` (flock, not waiting): held, another zygote serves this key or is
   starting: exit at once. Two shims that raced to start one leave one.
2. Notes the code on disk (:func:`fingerprint`: every installed distribution's ``*.dist-info``
   with its mtime, the newest ``.py`` of the project's packages ``flows``, ``collector`` and
   ``blocks``), then imports :data:`PRELOAD` (Prefect's engine, the collect flow and what a run
   imports on its way). No thread is started and no socket opened to the API: a fork copies
   only the calling thread, so a thread here would be missing, half-held locks and all, in
   every run.
3. Binds ``<KEY>.sock`` (0600 in a 0700 folder; bound under a temporary name and renamed into
   place) and serves: per request it checks the code on disk again (changed: *refuses*, stops
   listening, gives the socket and lock up for a fresh zygote, and exits once its runs ended)
   and forks. The parent sends the shim the run's pid and, when it reaped it, its exit code
   (``os.waitstatus_to_exitcode``). It exits, once no run of its is left, when every worker it
   served (the shims' parents) is gone, or after ``COLLECTOR_WARM_IDLE_S`` (600 s) with no run
   and no request. SIGTERM/SIGINT/SIGHUP: stops listening, exits once its runs ended.

The fork (:func:`_child`): closes everything of the zygote's (listening socket, lock, other
shims' connections), starts a session of its own (a signal to the zygote's group or the
worker's never reaches it by accident: the shim forwards what the worker sends), restores the
signal dispositions and mask the cold process would have had (the shim's ignored signals
stay ignored), puts the shim's stdin/stdout/stderr on 0/1/2, changes to its folder, takes its
environment whole (the per-run variables too), refreshes Prefect's settings (built at import)
and, if they or the logging file changed, its logging; then waits for the shim's "go" on the
life pipe, watches that pipe on a daemon thread (end of file: the shim died, the run SIGKILLs
itself: no orphan runs a flow) and runs ``prefect.engine`` as ``__main__`` as ``python -m``
would; then ends as an interpreter does (non-daemon threads joined, atexit handlers, streams
flushed), writes its exit code to the report pipe and exits with it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from typing import Any

from flows.warmstart import common

PRELOAD = ("prefect.engine", "prefect.flow_engine", "prefect.task_engine", "flows.collect")
# what a run still imported after the fork, measured (the fork's line in the zygote's log lists
# them): imported too when installed, so a run imports next to nothing. Imports only: nothing
# here connects anywhere or starts a thread (checked after the imports).
PRELOAD_IF_INSTALLED = (
    # the engine on its way to the flow
    "prefect._internal.metrics", "prefect._internal.states", "prefect.client.orchestration",
    "prefect.concurrency._sync", "prefect.runner.storage", "prefect.utilities.visualization",
    "opentelemetry.sdk.metrics", "opentelemetry.sdk.metrics.export", "opentelemetry.sdk.resources",
    "opentelemetry.semconv.resource", "anyio._backends._asyncio", "anyio.streams.memory",
    "anyio.streams.stapled", "anyio.streams.tls", "encodings.idna", "stringprep", "ctypes.util",
    "cryptography", "rich._emoji_codes",
    # the stores a source names (Redis, Postgres; SQLite and JSONL)
    "collector._closing", "collector._redis", "collector.frontier.redis",
    "collector.frontier.sqlite", "collector.deadletter.redis", "collector.deadletter.sqlite",
    "collector.deadletter.archive", "collector.fetch.shared_redis", "collector.sinks.postgres",
    "collector.sinks.jsonl", "collector.sinks._encode", "collector.ops.secrets",
    "redis.asyncio", "psycopg",
)  # fmt: skip
WATCHED = ("flows", "collector", "blocks")  # the project's packages (not installed as files)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def forked_runs(folder: str) -> dict[str, int]:
    """Flow run id -> the pid of the process a zygote of ``folder`` forked for it, read from the
    zygotes' logs (the "forked ..." line :meth:`fork` writes): what the tests and
    bench/warm_start.py tell a warm start by."""
    found = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".log"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as log:
            for line in log:
                if " forked " in line and " for flow run " in line:
                    words = line.split()
                    found[words[-1]] = int(words[words.index("forked") + 1])
    return found


def _log(text: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    try:
        sys.stdout.write(f"{stamp}Z zygote {os.getpid()}: {text}\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def fingerprint() -> str:
    """The code on disk a run would load: the installed distributions (their ``*.dist-info`` /
    ``*.egg-info`` and ``.pth`` names and mtimes: an upgrade or reinstall changes them) and the
    newest ``.py`` (and the count) of each of the project's packages that is not installed as
    files. About a millisecond."""
    import importlib.util

    parts: list[Any] = [sys.version]
    packages_dirs = []
    for entry in sys.path:
        if os.path.basename(entry) in ("site-packages", "dist-packages") and os.path.isdir(entry):
            packages_dirs.append(entry)
            listed = []
            with os.scandir(entry) as found:
                for item in found:
                    if item.name.endswith((".dist-info", ".egg-info", ".pth")):
                        try:
                            listed.append((item.name, item.stat().st_mtime_ns))
                        except OSError:
                            listed.append((item.name, 0))
            parts.append([entry, sorted(listed)])
    for package in WATCHED:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            if any(location.startswith(d + os.sep) for d in packages_dirs):
                continue  # installed: its dist-info says when it changes
            newest, count = 0, 0
            for folder, subfolders, files in os.walk(location):
                subfolders[:] = [s for s in subfolders if s != "__pycache__"]
                for name in files:
                    if name.endswith(".py"):
                        try:
                            newest = max(newest, os.stat(os.path.join(folder, name)).st_mtime_ns)
                        except OSError:
                            continue
                        count += 1
            parts.append([location, newest, count])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _logging_file() -> tuple[str, int]:
    from prefect.settings import PREFECT_LOGGING_SETTINGS_PATH

    path = str(PREFECT_LOGGING_SETTINGS_PATH.value())
    try:
        return path, os.stat(path).st_mtime_ns
    except OSError:
        return path, 0


class Zygote:
    def __init__(self, zygote_key: str, folder: str, parents: set[int] | None = None) -> None:
        self.key = zygote_key
        self.parents = set(parents or ())  # the workers whose runs it started
        self.folder = folder
        self.where = common.paths(folder, zygote_key)
        self.idle_s = common.idle_s(os.environ)
        self.lock = -1
        self.listener: socket.socket | None = None
        self.socket_inode: int | None = None
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        self.children: dict[int, socket.socket | None] = {}  # pid -> its shim's connection
        self.started_at: dict[int, float] = {}
        self.retiring: str | None = None
        self.stop_signal: str | None = None
        self.last_activity = time.monotonic()
        self.code: str = ""
        self.original_handlers: dict[int, Any] = {}
        self.preloaded_modules: frozenset[str] = frozenset()
        self.settings: Any = None
        self.logging_file: tuple[str, int] = ("", 0)

    # --- start --------------------------------------------------------------------------------
    def take_lock(self) -> bool:
        """The key's lock, or False (held). The file is removed by the holder as it exits, so a
        lock taken on a file just removed is not the lock: take it again on the new one."""
        while True:
            lock = os.open(self.where.lock, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(lock)
                return False
            try:
                if os.stat(self.where.lock).st_ino == os.fstat(lock).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(lock)
        self.lock = lock
        with open(self.where.pid, "w", encoding="ascii") as out:
            out.write(f"{os.getpid()}\n")
        _prune(self.folder)
        return True

    def preload(self) -> None:
        self.code = fingerprint()
        began, cpu = time.monotonic(), time.process_time()
        for name in PRELOAD:
            importlib.import_module(name)
        for name in PRELOAD_IF_INSTALLED:
            try:
                importlib.import_module(name)
            except ImportError as exc:  # an optional extra not installed: the run imports it
                _log(f"not preloaded: {name} ({exc})")
        import prefect.context

        self.settings = prefect.context.GLOBAL_SETTINGS_CONTEXT.settings
        self.logging_file = _logging_file()
        self.preloaded_modules = frozenset(sys.modules)
        threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        if threads:  # a fork would copy none of them: refuse to serve rather than break runs
            raise RuntimeError(f"threads running after the imports: {threads}")
        _log(
            f"preloaded {len(PRELOAD) + len(PRELOAD_IF_INSTALLED)} modules "
            f"({len(sys.modules)} in all) in "
            f"{time.monotonic() - began:.2f} s ({time.process_time() - cpu:.2f} s CPU)"
        )

    def bind(self) -> None:
        temporary = f"{self.where.socket}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(temporary)
        os.chmod(temporary, 0o600)
        listener.listen(128)
        os.replace(temporary, self.where.socket)  # atomically: a shim never finds no socket
        self.socket_inode = os.stat(self.where.socket).st_ino
        listener.setblocking(False)
        self.listener = listener
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        for number in (signal.SIGCHLD, *STOP_SIGNALS):
            self.original_handlers[number] = signal.getsignal(number)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd does the work
        for number in STOP_SIGNALS:
            signal.signal(number, self._stop)

    def _stop(self, number: int, _frame: object) -> None:
        self.stop_signal = signal.Signals(number).name  # the loop retires (not mid-select here)

    # --- serve --------------------------------------------------------------------------------
    def serve(self) -> None:
        _log(f"serving {self.where.socket}")
        while True:
            self.reap()
            if self.stop_signal is not None:
                self.retire(f"signal {self.stop_signal}")
            if not self.children:
                if self.retiring is not None:
                    _log(f"exiting ({self.retiring})")
                    return
                if time.monotonic() - self.last_activity > self.idle_s:
                    self.retire(f"idle {self.idle_s:g} s")
                    continue
                if self.parents and not any(_alive(p) for p in self.parents):
                    self.retire("the workers it served are gone")
                    continue
            for selected, _ in self.selector.select(timeout=1.0):
                what = selected.data
                if what == "accept":
                    self.accept()
                elif what == "wake":
                    try:
                        while os.read(self.wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                else:  # a shim's connection: it should say nothing; end of file: it died
                    self.shim_event(what, selected.fileobj)  # type: ignore[arg-type]

    def accept(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            _log(f"accept failed: {exc}")
            return
        self.last_activity = time.monotonic()
        conn.setblocking(True)
        conn.settimeout(10.0)  # a shim sends its request at once
        fds: list[int] = []
        try:
            request, fds = common.Channel(conn).receive(max_fds=len(common.FDS))
            refusal = self.refusal(request, fds)
            if refusal is not None:
                if refusal.startswith("stale"):
                    self.retire(refusal)
                common.send_message(conn, {"refused": refusal})
                _log(f"refused a run: {refusal}")
                conn.close()
                return
            assert request is not None
            if isinstance(request.get("parent"), int) and request["parent"] > 1:
                self.parents.add(request["parent"])
            pid = self.fork(request, fds, conn)
            conn.settimeout(None)
            common.send_message(conn, {"pid": pid})
        except OSError as exc:
            _log(f"request failed: {exc}")
            conn.close()
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def refusal(self, request: dict[str, Any] | None, fds: list[int]) -> str | None:
        if self.retiring is not None:
            return f"retiring ({self.retiring})"
        if request is None or len(fds) != len(common.FDS):
            return "incomplete request"
        if request.get("v") != common.PROTOCOL or request.get("key") != self.key:
            return "another protocol or key"
        if fingerprint() != self.code:
            return "stale: the code on disk changed since this zygote started"
        return None

    def fork(self, request: dict[str, Any], fds: list[int], conn: socket.socket) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the run; never returns
            try:
                self._child(request, fds, conn)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(70)
        self.children[pid] = conn
        self.started_at[pid] = time.monotonic()
        self.selector.register(conn, selectors.EVENT_READ, pid)
        _log(f"forked {pid} for flow run {request['env'].get('PREFECT__FLOW_RUN_ID', '?')}")
        # (read back by forked_runs: keep the two in step)
        return pid

    def shim_event(self, pid: int, conn: socket.socket) -> None:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if data:
            return
        self.selector.unregister(conn)
        conn.close()
        if self.children.get(pid) is conn:
            self.children[pid] = None  # its run reads the end of its life pipe and dies
            _log(f"the shim of {pid} is gone")

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            conn = self.children.pop(pid, None)
            took = time.monotonic() - self.started_at.pop(pid, time.monotonic())
            _log(f"{pid} ended with {code} after {took:.1f} s")
            self.last_activity = time.monotonic()
            if conn is not None:
                with contextlib.suppress(OSError):
                    common.send_message(conn, {"exit": code})
                self.selector.unregister(conn)
                conn.close()

    def retire(self, why: str) -> None:
        """Stop listening and give the socket and the lock up (a fresh zygote may take them);
        the runs still going are reaped and reported before this process exits."""
        if self.retiring is not None:
            return
        self.retiring = why
        _log(f"retiring: {why}")
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
        try:
            if (
                self.socket_inode is not None
                and os.stat(self.where.socket).st_ino == self.socket_inode
            ):
                os.unlink(self.where.socket)
        except OSError:
            pass
        try:
            with open(self.where.pid, encoding="ascii") as found:
                if found.read().strip() == str(os.getpid()):
                    os.unlink(self.where.pid)
        except OSError:
            pass
        if self.lock >= 0:
            with contextlib.suppress(OSError):
                if os.stat(self.where.lock).st_ino == os.fstat(self.lock).st_ino:
                    os.unlink(self.where.lock)  # held: nobody else holds this file
            os.close(self.lock)
            self.lock = -1

    # --- the run ------------------------------------------------------------------------------
    def _child(self, request: dict[str, Any], fds: list[int], own: socket.socket) -> None:
        stdin, stdout, stderr, life, report = fds
        # nothing of the zygote's stays open here: its shims must see its end, the lock its owner
        for conn in [own, *(c for c in self.children.values() if c is not None)]:
            os.close(conn.detach())
        if self.listener is not None:
            os.close(self.listener.detach())
        os.close(self.selector.fileno())
        for fd in (self.wake_r, self.wake_w, self.lock):
            if fd >= 0:
                os.close(fd)
        os.setsid()
        signal.set_wakeup_fd(-1)
        for number, handler in self.original_handlers.items():
            signal.signal(number, handler)
        for number in request.get("ignored", []):
            signal.signal(number, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, request.get("mask", []))
        for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
            os.dup2(fd, target)
            os.close(fd)
        began = time.monotonic()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if sys.path and sys.path[0] == self.folder:  # `python -m` puts the working folder first
            sys.path[0] = os.getcwd()
        # runpy puts the module's path first, as `python -m prefect.engine` has it
        sys.argv = ["", *request.get("args", [])]
        self._refresh_prefect()
        if os.read(life, 1) != b"g":  # the shim gave up on this fork (or died): run nothing
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=_watch, args=(life,), name="warm-life", daemon=True).start()
        code = _run_module(request.get("module") or common.ENGINE_MODULE)
        _log_to(self.where.log, self._summary(request, code, began))
        with contextlib.suppress(OSError):
            os.write(report, f"{code}\n".encode())
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code & 0xFF)

    def _refresh_prefect(self) -> None:
        """Prefect's settings are built at import (GLOBAL_SETTINGS_CONTEXT): build them again from
        this run's environment and profile; logging again only if they or its file changed."""
        import prefect.context

        prefect.context.refresh_global_settings_context()
        settings = prefect.context.GLOBAL_SETTINGS_CONTEXT.settings
        if settings != self.settings or _logging_file() != self.logging_file:
            from prefect.logging.configuration import setup_logging

            setup_logging(incremental=False)

    def _summary(self, request: dict[str, Any], code: int, began: float) -> str:
        late = sorted(set(sys.modules) - self.preloaded_modules)
        shown = ", ".join(late[:12]) + (", ..." if len(late) > 12 else "")
        run = request["env"].get("PREFECT__FLOW_RUN_ID", "?")
        return (
            f"fork {os.getpid()} of flow run {run}: exit {code} after "
            f"{time.monotonic() - began:.1f} s; {len(late)} modules imported in the fork"
            + (f" ({shown})" if late else "")
        )


LOG_KEPT_S = 7 * 86400


def _prune(folder: str) -> None:
    """The logs of zygotes long gone (a week without a line): removed."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(folder) as found:
        for item in found:
            if item.name.endswith(".log") and now - item.stat().st_mtime > LOG_KEPT_S:
                with contextlib.suppress(OSError):
                    os.unlink(item.path)


def _alive(pid: int) -> bool:
    """Process ``pid`` runs (not a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _watch(life: int) -> None:
    """End of file on the life pipe: the shim died (SIGKILL too): so does the run, at once."""
    while True:
        try:
            if not os.read(life, 64):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


def _run_module(module: str) -> int:
    """``python -m MODULE`` (``prefect.engine``) in this process, and its exit code as the
    interpreter would give it (``-N``: end by signal N, as on an uncaught KeyboardInterrupt)."""
    import atexit
    import runpy
    import traceback

    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _system_exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # what the interpreter does on its way out: join non-daemon threads, atexit, flush
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    return code


def _system_exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value
    with contextlib.suppress(OSError, ValueError):
        print(value, file=sys.stderr)
    return 1


def _log_to(path: str, text: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{stamp}Z {text}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or (len(argv) == 3 and not argv[2].isdigit()):
        print("usage: python -m flows.warmstart.zygote KEY [WORKER_PID] (the shim starts it)",
              file=sys.stderr)  # fmt: skip
        return 2
    zygote_key = argv[1]
    parents = {int(argv[2])} if len(argv) == 3 and int(argv[2]) > 1 else set()
    try:
        folder = common.runtime_dir(os.environ)
    except common.Unsafe as exc:
        print(f"zygote: {exc}", file=sys.stderr)
        return 2
    if common.key(os.environ, common.identity()) != zygote_key:
        _log("this process's key is not the one it was started for: not serving")
        return 2
    try:
        zygote = Zygote(zygote_key, folder, parents)
    except common.Unsafe as exc:
        print(f"zygote: {exc}", file=sys.stderr)
        return 2
    if not zygote.take_lock():
        return 0  # another zygote serves this key (or is starting)
    try:
        zygote.preload()
        zygote.bind()
        zygote.serve()
    except Exception as exc:
        _log(f"failed: {type(exc).__name__}: {exc}")
        zygote.retire(f"failed: {exc}")
        return 1
    finally:
        zygote.retire("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
