"""The local Prefect server the ``collector`` command starts once, in the background, and reuses.

Without ``PREFECT_API_URL`` Prefect starts a temporary server for every process: about 10-20 s
of a small run's 15-23 s, and it shares the terminal's process group, so a Ctrl-C meant for the
run kills the server first and the run then drowns in connection errors. Instead, the first
``collector run`` starts one server in its own session (a Ctrl-C never reaches it), records it
in its state folder and every later command reuses it after one health check. It serves the UI,
so runs started from the terminal show there, and it stops by itself after
``LOCAL_SERVER_IDLE_S`` without use and without active flow runs.

One server per install: the state folder is ``$PREFECT_HOME/collector-servers/<install>/``, the
install being this Python environment (``sys.prefix``), so a clone with its own venv never
attaches to a server another venv started (another Prefect, perhaps another version), and
``collector server stop`` stops only this install's. The folder also holds the server's SQLite
database (unless the user configured one): two Prefect versions never migrate one database back
and forth. A recorded server is used only when its Prefect version is this command's;
otherwise it is stopped (it is this install's, left from before an upgrade) and a new one
started.

The UI is told where its API is (``PREFECT_UI_API_URL``, what ``GET /ui-settings`` answers):
the address the server listens on, unless the user set that setting for a proxy (then theirs).
Without it Prefect would answer its default port 4200 and every page would fail.

``collector server status`` shows it (URL, pid, idle time), ``collector server stop`` stops it.
A user's own ``PREFECT_API_URL`` always wins: then nothing is started.

The supervisor (``python -m flows.local_server``) runs the same uvicorn command Prefect's own
temporary server runs, watches it, and owns the idle exit.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from collector import defaults
from collector.run.liveness import pid_exists

__all__ = [
    "LocalServer",
    "configured_api_url",
    "ensure_local_server",
    "find_local_server",
    "other_servers",
    "stop_local_server",
    "use_local_server",
]

_HEALTH_TIMEOUT_S = 2.0
_PATIENT_HEALTH_S = 15.0  # before starting another server: a loaded box answers slowly
_ACTIVE_STATES = ["RUNNING", "PENDING", "CANCELLING"]


@dataclass(frozen=True, slots=True)
class LocalServer:
    """What the state file says about the running server."""

    url: str  # the API URL, ending in /api
    pid: int  # the supervisor's pid
    port: int
    started_at: float
    log: str
    prefect_version: str  # the Prefect that serves it (a server is used only by the same one)
    python: str  # the interpreter that started it (sys.executable)

    @property
    def ui(self) -> str:
        return self.url.removesuffix("/api")


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def install_key() -> str:
    """This install's name among the servers of one PREFECT_HOME: a digest of ``sys.prefix``."""
    prefix = os.path.realpath(sys.prefix)
    return hashlib.sha256(prefix.encode()).hexdigest()[:12]


def state_folder() -> Path:
    """This install's folder: the state file, the start lock, the log, the database."""
    return prefect_home() / "collector-servers" / install_key()


def _state_file() -> Path:
    return state_folder() / "server.json"


def _prefect_version() -> str:
    from importlib.metadata import version

    return version("prefect")  # the metadata only: importing Prefect costs a second


@contextlib.contextmanager
def _exclusive() -> Iterator[None]:
    """One process at a time decides whether to start the server (two CLIs, one server)."""
    path = state_folder() / "server.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _healthy(url: str, timeout: float = _HEALTH_TIMEOUT_S) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _read_state() -> LocalServer | None:
    try:
        data = json.loads(_state_file().read_text(encoding="utf-8"))
        return LocalServer(**data)
    except (OSError, ValueError, TypeError):
        return None


def _trusted(server: LocalServer) -> bool:
    """Served by this install's Prefect version (not one left from before an upgrade). The
    install itself is the state folder's; its Python may be named by several links."""
    return server.prefect_version == _prefect_version()


def find_local_server(patience_s: float = _HEALTH_TIMEOUT_S) -> LocalServer | None:
    """The recorded server if it is this install's and answers its health check within
    ``patience_s`` (and marks it used), else None."""
    server = _read_state()
    if server is None or not _trusted(server) or not _healthy(server.url, timeout=patience_s):
        return None
    with contextlib.suppress(OSError):
        os.utime(_state_file())  # used now: the idle clock starts again
    return server


def other_servers() -> list[LocalServer]:
    """Servers other installs started under this PREFECT_HOME that answer (never used or stopped
    here), including one an earlier Collector recorded in ``$PREFECT_HOME/collector-server.json``.
    """
    own = _state_file()
    paths = [prefect_home() / "collector-server.json"]
    paths += sorted((prefect_home() / "collector-servers").glob("*/server.json"))
    found = []
    for path in paths:
        if path == own:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            earlier = {"prefect_version": "?", "python": "an earlier Collector"}
            server = LocalServer(**{**earlier, **data})
        except (OSError, ValueError, TypeError):
            continue
        if _healthy(server.url):
            found.append(server)
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ensure_local_server(
    *, on_start: Callable[[str], None] | None = None, timeout_s: float = 120.0
) -> LocalServer:
    """The running local server, started in the background first when there is none."""
    server = find_local_server()
    if server is not None:
        return server
    with _exclusive():
        server = find_local_server(patience_s=_PATIENT_HEALTH_S)  # started meanwhile, or slow
        if server is not None:
            return server
        stale = _read_state()
        if stale is not None and not _trusted(stale) and pid_exists(stale.pid):
            stop_local_server()  # this install's, left from before an upgrade of Prefect
        port = _free_port()
        url = f"http://127.0.0.1:{port}/api"
        log = state_folder() / "server.log"
        if on_start is not None:
            on_start(url)
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "flows.local_server", "--port", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal never reaches it
                env={**os.environ, "PYTHONPATH": _import_root()},
            )
        deadline = time.monotonic() + timeout_s
        while not _healthy(url, timeout=1.0):
            if process.poll() is not None:
                raise RuntimeError(
                    f"the local Prefect server exited with code {process.returncode}; see {log}"
                )
            if time.monotonic() > deadline:
                process.terminate()
                raise RuntimeError(f"the local Prefect server did not answer in {timeout_s:g} s")
            time.sleep(0.2)
        server = LocalServer(
            url, process.pid, port, time.time(), str(log), _prefect_version(), sys.executable
        )
        _state_file().write_text(json.dumps(asdict(server)), encoding="utf-8")
        return server


def _import_root() -> str:
    """So the supervisor imports this very checkout of ``flows`` (an editable install or not)."""
    root = str(Path(__file__).resolve().parents[1])
    existing = os.environ.get("PYTHONPATH", "")
    return root if not existing else f"{root}{os.pathsep}{existing}"


def stop_local_server(
    timeout_s: float = 20.0, *, say: Callable[[str], None] | None = None
) -> LocalServer | None:
    """Stop this install's recorded server (if any); returns what was stopped. ``say`` is told,
    before the wait, what is waited for: the supervisor stops its server at once, and the
    server ends its requests in flight and its services first (a second or two)."""
    server = _read_state()
    if server is None:
        return None
    with contextlib.suppress(ProcessLookupError):
        os.kill(server.pid, signal.SIGTERM)
    if say is not None:
        say(
            f"stopping the local Prefect server at {server.ui} (pid {server.pid}): waiting for "
            "it to end its requests in flight and its services"
        )
    deadline = time.monotonic() + timeout_s
    while pid_exists(server.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(FileNotFoundError):
        _state_file().unlink()
    return server


def configured_api_url() -> str | None:
    """The user's own Prefect API: ``PREFECT_API_URL``, or the active profile's setting.

    Read from the environment and ``profiles.toml`` directly: importing Prefect's settings
    costs a second the command may not need yet.
    """
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    import tomllib

    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or prefect_home() / "profiles.toml")
    try:
        profiles = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    value = profiles.get("profiles", {}).get(active, {}).get("PREFECT_API_URL")
    return str(value) if value else None


def use_local_server(*, say: Callable[[str], None] | None = None) -> str | None:
    """Point this process at the local background server, starting it if needed.

    Does nothing (returns None) when the user configured an API, or opted out with
    ``COLLECTOR_LOCAL_SERVER=0`` (then Prefect's own temporary server is used, as before).
    """
    if configured_api_url() or os.environ.get("COLLECTOR_LOCAL_SERVER", "1") == "0":
        return None
    if "prefect.settings" in sys.modules:  # already configured in this process (a test harness)
        from prefect.settings import PREFECT_API_URL

        if PREFECT_API_URL.value():
            return None

    def starting(url: str) -> None:
        if say is not None:
            say(
                f"starting a local Prefect server in the background at {url.removesuffix('/api')}"
                " (reused by later commands; `collector server stop` stops it)"
            )

    server = ensure_local_server(on_start=starting)
    os.environ["PREFECT_API_URL"] = server.url
    return server.url


# --- the supervisor ----------------------------------------------------------------------------
def _active_runs(url: str) -> int:
    body = json.dumps({"flow_runs": {"state": {"type": {"any_": _ACTIVE_STATES}}}}).encode()
    request = urllib.request.Request(
        f"{url}/flow_runs/count", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(json.loads(response.read()))
    except (OSError, ValueError):
        return 1  # cannot tell: not idle


def server_environment(port: int) -> dict[str, str]:
    """The uvicorn process's environment: the UI told its own API, this install's database
    and, with it, leases kept on disk beside it (``flows/_lease_storage.py``).

    Prefect computes the UI's API URL (``GET /ui-settings``) from ``PREFECT_UI_API_URL``, else
    ``PREFECT_API_URL``, else ``PREFECT_SERVER_API_HOST``:``PREFECT_SERVER_API_PORT`` (4200 by
    default): none of them names this port, so it is set here, unless the user set it (in the
    environment or the profile) for the address a proxy serves the server at. The database is
    this install's (see the module's docstring) unless the user configured one.
    """
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "true",  # runs started from the terminal show in its UI
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
    }
    env.pop("PREFECT_API_URL", None)
    user_set = "api_url" in settings.server.ui.model_fields_set  # env or profile: a proxy's
    env["PREFECT_UI_API_URL"] = (
        str(settings.server.ui.api_url) if user_set else f"http://127.0.0.1:{port}/api"
    )
    if "connection_url" not in settings.server.database.model_fields_set:
        database = state_folder() / "prefect.db"
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{database}"
        if "lease_storage" not in settings.server.concurrency.model_fields_set:
            # leases outlive the server, so slots of a run that died with it come back
            # (flows/_lease_storage.py); beside the database whose slots they count
            from flows import _lease_storage

            env["PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"] = _lease_storage.MODULE
            env[_lease_storage.LEASES_FOLDER_VARIABLE] = str(state_folder() / "leases")
    return env


def _die_with_parent() -> None:
    """In the uvicorn child, before it runs: on Linux, SIGTERM it when its supervisor dies.

    A supervisor killed outright (SIGKILL, a test's teardown, the OOM killer) cannot stop its
    server, which then served on, idle, for good (CI runs left such servers behind)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _serve(port: int, idle_s: float) -> int:
    import prefect

    env = server_environment(port)
    server = subprocess.Popen(
        [
            sys.executable, "-m", "uvicorn",
            "--app-dir", str(prefect.__module_path__.parent),
            "--factory", "prefect.server.api.server:create_app",
            "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on",
        ],
        env=env,
        preexec_fn=_die_with_parent,  # the supervisor has no threads yet: safe
    )  # fmt: skip

    def stop(signum: int, frame: object) -> None:
        server.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    url = f"http://127.0.0.1:{port}/api"
    check_every = min(15.0, max(idle_s / 4, 0.5))
    try:
        while True:
            try:  # not a sleep: a stop (SIGTERM: the server exits) ends this wait at once
                server.wait(timeout=check_every)
                break
            except subprocess.TimeoutExpired:
                pass
            try:
                idle = time.time() - _state_file().stat().st_mtime
            except OSError:
                idle = 0.0  # not recorded yet (starting) or being rewritten
            if idle > idle_s and _active_runs(url) == 0:
                server.terminate()
                break
    finally:
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        state = _read_state()
        if state is not None and state.pid == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                _state_file().unlink()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Collector's local Prefect server supervisor")
    parser.add_argument("--port", type=int, required=True, help="port of the API and UI")
    parser.add_argument(
        "--idle-exit",
        type=float,
        default=float(os.environ.get("COLLECTOR_SERVER_IDLE_S", defaults.LOCAL_SERVER_IDLE_S)),
        help="exit after this many seconds without use and without active flow runs",
    )
    args = parser.parse_args(argv)
    return _serve(args.port, args.idle_exit)


if __name__ == "__main__":
    raise SystemExit(main())
