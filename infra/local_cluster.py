"""Collector's scale-out topology as local processes (the shape of infra/compose.yaml, no Docker).

    infra/local-cluster up [--dir DIR] [--workers N] [--port PORT] [--postgres-dsn DSN]
    infra/local-cluster status | down
    infra/local-cluster start|stop|kill NAME      # one component, e.g. api-1, services, redis

``up`` starts, in order: a throwaway Postgres (initdb on a free port; or ``--postgres-dsn``),
a throwaway Redis (free port, append-only file as in compose), ``prefect server database
upgrade``, two API replicas (``prefect server start --no-services``), one ``prefect server
services start``, nginx in front of the replicas (the server block of infra/nginx.conf, its
upstreams pointed at the replicas' ports), ``infra/bootstrap``, and N process workers of the
``collector`` pool. Every server process gets exactly the settings of infra/prefect-server.env
and every worker those of infra/prefect-worker.env (the files compose and the Helm values use);
only addresses are the cluster's own. The caller's environment is passed through underneath
(so e.g. a faster scheduler loop can be added), but never overrides a setting of those files.

Everything lives in DIR (default ``$COLLECTOR_CLUSTER_DIR`` or ``.local-cluster`` in the
checkout): ``state.json`` (ports, pids, how to start each component again), ``cluster.env``
(``PREFECT_API_URL``, ``COLLECTOR_REDIS_URL``, ``COLLECTOR_POSTGRES_DSN`` for ``set -a; .
cluster.env``) and ``logs/<component>.log``. ``down`` stops everything (workers first, with
the flow runs they started), then deletes the throwaway databases; logs stay.

``kill NAME`` is SIGKILL (a worker together with the flow runs it started: a lost machine);
``stop NAME`` is SIGTERM and a wait; ``start NAME`` starts a stopped component again with the
same ports and settings and waits for a readiness signal of *this* start (its own health
endpoint; for the services process a log line written after this start; for a worker a
heartbeat newer than this start), then says which signal it waited for and how long.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
SERVER_ENV_FILE = INFRA / "prefect-server.env"
WORKER_ENV_FILE = INFRA / "prefect-worker.env"
NGINX_SERVER_CONF = INFRA / "nginx.conf"
START_TIMEOUT_S = 240.0  # a Prefect server's first start on a loaded 2-core box
REDIS_DB = {"messaging": 0, "docket": 1, "collector": 2}  # as in infra/compose.yaml


class ClusterError(Exception):
    """A one-line reason the cluster could not be started, stopped or read."""


# --- settings -----------------------------------------------------------------------------------
def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (``#`` comments, blank lines); what compose's ``env_file`` reads."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise ClusterError(f"{path}:{number}: expected KEY=VALUE, got {line!r}")
        values[key] = value
    return values


def server_addresses(
    *, database_url: str, redis_host: str, redis_port: int, api_host: str, api_port: int,
    ui_api_url: str,
) -> dict[str, str]:  # fmt: skip
    """The per-place part of a server's settings (the same keys compose and Helm set)."""
    return {
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": database_url,
        "PREFECT_SERVER_DOCKET_URL": f"redis://{redis_host}:{redis_port}/{REDIS_DB['docket']}",
        "PREFECT_REDIS_MESSAGING_HOST": redis_host,
        "PREFECT_REDIS_MESSAGING_PORT": str(redis_port),
        "PREFECT_SERVER_API_HOST": api_host,
        "PREFECT_SERVER_API_PORT": str(api_port),
        "PREFECT_SERVER_UI_API_URL": ui_api_url,
    }


# --- processes ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found, depth-first)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def _signal(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pids: Sequence[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def _unprivileged() -> pwd.struct_passwd:
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ClusterError("running as root and there is no 'postgres' or 'nobody' user for postgres")


def _postgres_bin() -> Path:
    found = shutil.which("initdb")
    if found and (Path(found).resolve().parent / "postgres").exists():
        return Path(found).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if not versions:
        raise ClusterError("postgres is not installed (apt-get install postgresql)")
    return versions[-1].parent


def _ensure_binary(name: str, package: str) -> str:
    """The binary, installed with apt when missing (as ./bootstrap does for redis-server)."""
    found = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if Path(p).exists()), None
    )
    if found:
        return found
    print(f"local-cluster: installing {package} with apt-get", file=sys.stderr)
    sudo = [] if os.getuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        done = subprocess.run([*sudo, *argv], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {done.stderr.strip()[-300:]}")
    found = shutil.which(name) or f"/usr/sbin/{name}"
    if not Path(found).exists():
        raise ClusterError(f"{package} installed but {name} not found")
    return found


# --- the cluster --------------------------------------------------------------------------------
@dataclass
class Cluster:
    """The state of one local cluster (``DIR/state.json``)."""

    folder: Path
    state: dict[str, Any]

    @classmethod
    def load(cls, folder: Path) -> Cluster:
        path = folder / "state.json"
        if not path.exists():
            raise ClusterError(f"no cluster in {folder} (infra/local-cluster up first)")
        return cls(folder, json.loads(path.read_text(encoding="utf-8")))

    def save(self) -> None:
        path = self.folder / "state.json"
        path.write_text(json.dumps(self.state, indent=2), encoding="utf-8")
        path.chmod(0o600)  # a given DSN may carry a password

    @property
    def components(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = self.state.setdefault("components", {})
        return result

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.state['ports']['nginx']}/api"

    def log(self, name: str) -> Path:
        return self.folder / "logs" / f"{name}.log"

    def spawn(self, name: str) -> int:
        """Start component ``name`` from its recorded spec; returns its pid."""
        spec = self.components[name]
        env = {**os.environ, **spec["env"]}
        user: dict[str, Any] = {}
        if spec.get("unprivileged") and os.getuid() == 0:
            account = _unprivileged()
            user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        log_offset = self.log(name).stat().st_size if self.log(name).exists() else 0
        started_at = time.time()
        with self.log(name).open("ab") as log:
            process = subprocess.Popen(
                spec["argv"], cwd=spec.get("cwd", str(ROOT)), env=env, stdout=log,
                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                **user,
            )  # fmt: skip
        spec["pid"] = process.pid
        spec["started_at"] = started_at  # readiness must be newer than this (see ready)
        spec["log_offset"] = log_offset  # a ready line must be past this
        self.save()
        return process.pid

    def running(self, name: str) -> bool:
        pid = self.components.get(name, {}).get("pid")
        if not pid:
            return False
        return _alive(int(pid))

    def start(self, name: str, *, wait: bool = True) -> str:
        """Start ``name`` unless running; with ``wait``, wait for its fresh readiness signal and
        return a line saying which signal and how long it took."""
        if name not in self.components:
            raise ClusterError(f"no component {name!r} (one of {', '.join(self.components)})")
        began = time.monotonic()
        started = not self.running(name)
        if started:
            self.spawn(name)
        if not wait:
            return f"{name}: started, not waited for"
        self.wait_ready(name)
        took = time.monotonic() - began
        how = "started" if started else "already running"
        return f"{name}: {how}, ready after {took:.1f} s ({self.signal_of(name)})"

    def signal_of(self, name: str) -> str:
        """What :meth:`ready` waits for, in words (said by ``start``)."""
        spec = self.components[name]
        return {
            "postgres": "a connection to the admin database succeeded",
            "redis": f"PING answered PONG on port {spec.get('port')}",
            "api": f"GET /api/health answered 200 on port {spec.get('port')}",
            "nginx": f"GET /api/health through nginx answered 200 on port {spec.get('port')}",
            "services": "its log printed 'Starting services' after this start",
            "worker": f"{spec.get('worker_name')} sent a heartbeat newer than this start, ONLINE",
        }.get(spec["kind"], "it answered")

    def signal(self, name: str, sig: int, *, timeout: float = 30.0) -> None:
        """Send ``sig`` to the component and everything it started (a worker's flow runs)."""
        spec = self.components.get(name)
        if spec is None:
            raise ClusterError(f"no component {name!r} (one of {', '.join(self.components)})")
        pid = spec.get("pid")
        if not pid or not _alive(int(pid)):
            return
        pids = [int(pid)]
        if spec["kind"] == "worker" or sig == signal.SIGKILL:
            pids += _descendants(int(pid))
        _signal(pids, sig)
        if not _wait_gone(pids, timeout):
            _signal([int(pid), *_descendants(int(pid))], signal.SIGKILL)
            _wait_gone(pids, 10)

    def stop(self, name: str) -> None:
        kind = self.components[name]["kind"]
        sig = signal.SIGINT if kind == "postgres" else signal.SIGTERM  # postgres: fast shutdown
        self.signal(name, sig, timeout=30)

    # readiness ----------------------------------------------------------------------------------
    def ready(self, name: str) -> str | None:
        """None when ``name`` answers, else why not (one line)."""
        spec = self.components[name]
        if not self.running(name):
            return "not running"
        kind = spec["kind"]
        try:
            if kind == "postgres":
                import psycopg

                psycopg.connect(self.state["postgres_admin_dsn"], connect_timeout=2).close()
            elif kind == "redis":
                with socket.create_connection(("127.0.0.1", spec["port"]), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if not sock.recv(16).startswith(b"+PONG"):
                        return "no PONG"
            elif kind in ("api", "nginx"):
                url = f"http://127.0.0.1:{spec['port']}/api/health"
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status != 200:
                        return f"health {response.status}"
            elif kind == "services":
                # only what this start wrote: a line left by an earlier start says nothing
                with self.log(name).open("rb") as log:
                    log.seek(int(spec.get("log_offset", 0)))
                    text = log.read().decode(errors="replace")
                if "Starting services" not in text:  # printed once its services are set up
                    return "starting (no 'Starting services' since this start)"
            elif kind == "worker":
                return self._worker_online(spec["worker_name"], float(spec.get("started_at", 0)))
        except (OSError, urllib.error.URLError) as exc:
            return f"{type(exc).__name__}: {exc}"[:200]
        except Exception as exc:  # psycopg errors
            return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return None

    def _worker_online(self, worker_name: str, since: float) -> str | None:
        """None when ``worker_name`` is ONLINE with a heartbeat newer than ``since`` (a killed
        worker's record stays ONLINE under the same name for a while: not this start's)."""
        request = urllib.request.Request(
            self.api_url + "/work_pools/collector/workers/filter",
            data=b"{}",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            workers = json.loads(response.read())
        for worker in workers:
            if worker["name"] != worker_name:
                continue
            beat = worker.get("last_heartbeat_time")
            at = datetime.fromisoformat(beat).timestamp() if beat else 0.0
            if at <= since:
                return f"no heartbeat since this start (last {since - at:.0f} s before it)"
            return None if worker["status"] == "ONLINE" else worker["status"].lower()
        return "not polling yet"

    def wait_ready(self, name: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        why = self.ready(name)
        while why is not None:
            if not self.running(name):
                tail = self.log(name).read_text(errors="replace")[-1500:]
                raise ClusterError(f"{name} exited; the end of {self.log(name)}:\n{tail}")
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} not ready after {timeout:.0f} s: {why}")
            time.sleep(0.3)
            why = self.ready(name)


# --- up -----------------------------------------------------------------------------------------
def _nginx_conf(runtime: Path, port: int, upstreams: Sequence[int], access_log: Path) -> str:
    """infra/nginx.conf's upstream and server blocks (the compose file's), pointed at our ports,
    inside a main block of our own (no daemon, files in our folders)."""
    server_conf = NGINX_SERVER_CONF.read_text(encoding="utf-8")
    servers = "".join(f"    server 127.0.0.1:{p};\n" for p in upstreams)
    server_conf, found = re.subn(
        r"(upstream prefect_api \{\n)(?:\s*server [^;]+;\n)+", lambda m: m.group(1) + servers,
        server_conf,
    )  # fmt: skip
    server_conf, listens = re.subn(r"listen 4200;", f"listen 127.0.0.1:{port};", server_conf)
    if found != 1 or listens != 1:
        raise ClusterError(f"{NGINX_SERVER_CONF}: expected one upstream block and 'listen 4200;'")
    temp = runtime / "nginx-tmp"
    user = "user root root;\n" if os.getuid() == 0 else ""  # temp files in our folder
    return (
        f"{user}worker_processes 1;\ndaemon off;\npid {runtime}/nginx.pid;\n"
        f"error_log stderr warn;\nevents {{ worker_connections 1024; }}\nhttp {{\n"
        f"    log_format upstream '$msec $request_method $uri $status $upstream_addr "
        f"$request_time';\n"
        f"    access_log {access_log} upstream;\n"
        f"    client_body_temp_path {temp}/body;\n    proxy_temp_path {temp}/proxy;\n"
        f"    fastcgi_temp_path {temp}/fastcgi;\n    uwsgi_temp_path {temp}/uwsgi;\n"
        f"    scgi_temp_path {temp}/scgi;\n"
        f"{server_conf}\n}}\n"
    )


def _run(argv: Sequence[str], env: dict[str, str], what: str, log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(
            argv, cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise ClusterError(f"{what} failed ({done.returncode}); the end of {log}:\n{tail}")


def _initdb(cluster: Cluster, runtime: Path, port: int) -> str:
    """A throwaway Postgres cluster in ``runtime/postgres``; returns its admin DSN."""
    binaries = _postgres_bin()
    data, sockets = runtime / "postgres", runtime / "sockets"
    sockets.mkdir()
    user: dict[str, Any] = {}
    if os.getuid() == 0:
        account = _unprivileged()
        user = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        os.chown(runtime, account.pw_uid, account.pw_gid)
        os.chown(sockets, account.pw_uid, account.pw_gid)
    done = subprocess.run(
        [str(binaries / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
         "--encoding=UTF8", "--no-locale", "--no-sync"],
        cwd=runtime, env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
        capture_output=True, text=True, **user,
    )  # fmt: skip
    if done.returncode != 0:
        raise ClusterError(f"initdb failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    cluster.components["postgres"] = {
        "kind": "postgres",
        "port": port,
        "unprivileged": True,
        "cwd": str(runtime),
        "env": {"LC_ALL": "C"},
        # Durable across a crash of the postgres process (the WAL is written); only an OS crash
        # could lose the last commits (synchronous_commit off), which a throwaway cluster accepts.
        "argv": [str(binaries / "postgres"), "-D", str(data), "-p", str(port),
                 "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={sockets}",
                 "-c", "synchronous_commit=off", "-c", "max_connections=300",
                 "-c", "shared_buffers=64MB"],
    }  # fmt: skip
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _create_databases(admin_dsn: str, names: Sequence[str]) -> None:
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')


def _with_database(dsn: str, name: str) -> str:
    head, _, _ = dsn.rpartition("/")
    return f"{head}/{name}"


def up(folder: Path, *, workers: int, port: int | None, postgres_dsn: str | None) -> Cluster:
    if (folder / "state.json").exists():
        cluster = Cluster.load(folder)
        if any(cluster.running(name) for name in cluster.components):
            raise ClusterError(f"a cluster is already running in {folder} (down first)")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "logs").mkdir(exist_ok=True)
    # Postgres and nginx run as an unprivileged user when we are root: their files live in a
    # folder of their own under /tmp that that user can reach (DIR's parents may be private).
    runtime = Path(tempfile.mkdtemp(prefix="collector-cluster-"))
    runtime.chmod(0o755)
    cluster = Cluster(folder, {"runtime": str(runtime), "components": {}})
    server_settings = read_env_file(SERVER_ENV_FILE)
    worker_settings = read_env_file(WORKER_ENV_FILE)
    ports = {"nginx": port or free_port(), "redis": free_port(), "api-1": free_port(),
             "api-2": free_port()}  # fmt: skip
    if postgres_dsn is None:
        ports["postgres"] = free_port()
        admin = _initdb(cluster, runtime, ports["postgres"])
    else:
        admin = postgres_dsn
    cluster.state["ports"] = ports
    cluster.state["postgres_admin_dsn"] = admin
    prefect_db = _with_database(admin, "prefect") if postgres_dsn is None else admin
    collector_db = _with_database(admin, "collector") if postgres_dsn is None else admin
    home = {"PREFECT_HOME": str(folder / "prefect-home")}
    api = f"http://127.0.0.1:{ports['nginx']}/api"
    redis_dir = runtime / "redis"
    redis_dir.mkdir()
    cluster.components["redis"] = {
        "kind": "redis", "port": ports["redis"], "env": {},
        "argv": [_ensure_binary("redis-server", "redis-server"), "--port", str(ports["redis"]),
                 "--bind", "127.0.0.1", "--protected-mode", "no", "--dir", str(redis_dir),
                 "--appendonly", "yes", "--save", ""],
    }  # fmt: skip

    def server_env(listen: int) -> dict[str, str]:
        addresses = server_addresses(
            database_url=prefect_db.replace("postgresql://", "postgresql+asyncpg://", 1),
            redis_host="127.0.0.1", redis_port=ports["redis"], api_host="127.0.0.1",
            api_port=listen, ui_api_url=api,
        )  # fmt: skip
        return {**home, **server_settings, **addresses}

    prefect = str(Path(sys.executable).parent / "prefect")
    for name in ("api-1", "api-2"):
        cluster.components[name] = {
            "kind": "api", "port": ports[name], "env": server_env(ports[name]),
            "argv": [prefect, "server", "start", "--no-services"],
        }  # fmt: skip
    cluster.components["services"] = {
        "kind": "services", "env": server_env(ports["api-1"]),
        "argv": [prefect, "server", "services", "start"],
    }  # fmt: skip
    nginx_conf = runtime / "nginx.conf"
    (runtime / "nginx-tmp").mkdir()
    nginx_conf.write_text(
        _nginx_conf(runtime, ports["nginx"], [ports["api-1"], ports["api-2"]],
                    folder / "logs" / "nginx-access.log"),
        encoding="utf-8",
    )  # fmt: skip
    cluster.components["nginx"] = {
        "kind": "nginx", "port": ports["nginx"], "env": {},
        "argv": [_ensure_binary("nginx", "nginx-light"), "-c", str(nginx_conf),
                 "-p", str(runtime), "-e", "stderr"],
    }  # fmt: skip
    redis_url = f"redis://127.0.0.1:{ports['redis']}/{REDIS_DB['collector']}"
    client_env = {
        "PREFECT_API_URL": api,
        "COLLECTOR_REDIS_URL": redis_url,
        "COLLECTOR_POSTGRES_DSN": collector_db,
    }
    for i in range(1, workers + 1):
        cluster.components[f"worker-{i}"] = {
            "kind": "worker", "worker_name": f"worker-{i}",
            "env": {**home, **worker_settings, **client_env, "PYTHONUNBUFFERED": "1"},
            "argv": [prefect, "worker", "start", "--pool", "collector", "--type", "process",
                     "--name", f"worker-{i}"],
        }  # fmt: skip
    cluster.save()
    (folder / "cluster.env").write_text(
        "".join(f"{k}={v}\n" for k, v in client_env.items()), encoding="utf-8"
    )
    (folder / "cluster.env").chmod(0o600)

    try:
        _start_all(cluster, folder / "logs", admin, postgres_dsn, prefect, home, client_env,
                   server_env(ports["api-1"]))  # fmt: skip
    except BaseException:
        down(folder)  # nothing left running when up fails
        raise
    return cluster


def _start_all(
    cluster: Cluster, logs: Path, admin: str, postgres_dsn: str | None, prefect: str,
    home: dict[str, str], client_env: dict[str, str], migrate_env: dict[str, str],
) -> None:  # fmt: skip
    if "postgres" in cluster.components:
        cluster.start("postgres")
    cluster.start("redis")
    _create_databases(admin, ["prefect", "collector"] if postgres_dsn is None else [])
    _run([prefect, "server", "database", "upgrade", "-y"], migrate_env,
         "prefect server database upgrade", logs / "migrate.log")  # fmt: skip
    # One replica first: each registers Prefect's block types at start, and two doing it at
    # once collide on a unique key (seen here; the second replica exits). Then the rest.
    cluster.start("api-1")
    for name in ("api-2", "services"):
        cluster.start(name, wait=False)
    for name in ("api-2", "nginx", "services"):
        cluster.start(name)
    _run([str(INFRA / "bootstrap")], {**home, **client_env}, "infra/bootstrap",
         logs / "bootstrap.log")  # fmt: skip
    workers_names = [n for n, s in cluster.components.items() if s["kind"] == "worker"]
    for name in workers_names:
        cluster.start(name, wait=False)
    for name in workers_names:
        cluster.wait_ready(name)


def down(folder: Path) -> None:
    cluster = Cluster.load(folder)
    order = ["worker", "nginx", "api", "services", "redis", "postgres"]
    for kind in order:
        for name, spec in cluster.components.items():
            if spec["kind"] == kind:
                cluster.stop(name)
    runtime = cluster.state.get("runtime")
    if runtime:
        shutil.rmtree(runtime, ignore_errors=True)
    (folder / "state.json").unlink()
    (folder / "cluster.env").unlink(missing_ok=True)


def status(folder: Path) -> int:
    cluster = Cluster.load(folder)
    bad = 0
    print(f"api: {cluster.api_url}")
    for name, spec in cluster.components.items():
        why = cluster.ready(name)
        bad += why is not None
        port = f":{spec['port']}" if spec.get("port") else ""
        print(f"{name:10} pid {spec.get('pid') or '-':>7} {port:7} {why or 'ok'}")
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="infra/local-cluster", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("command", choices=["up", "down", "status", "start", "stop", "kill"])
    parser.add_argument("name", nargs="?", help="component for start/stop/kill")
    default_dir = os.environ.get("COLLECTOR_CLUSTER_DIR") or str(ROOT / ".local-cluster")
    parser.add_argument("--dir", default=default_dir, help=f"state folder (default {default_dir})")
    parser.add_argument("--workers", type=int, default=2, help="process workers (default 2)")
    parser.add_argument("--port", type=int, default=None, help="nginx port (default: free)")
    parser.add_argument(
        "--postgres-dsn", default=None,
        help="use this database for Prefect and the sinks instead of a throwaway cluster",
    )  # fmt: skip
    args = parser.parse_args(argv)
    folder = Path(args.dir).resolve()
    try:
        if args.command == "up":
            if args.workers < 0:
                parser.error("--workers must be 0 or more")
            cluster = up(
                folder, workers=args.workers, port=args.port, postgres_dsn=args.postgres_dsn
            )
            print(f"local cluster up: PREFECT_API_URL={cluster.api_url} ({folder}/cluster.env)")
            return status(folder)
        if args.command == "down":
            down(folder)
            return 0
        if args.command == "status":
            return status(folder)
        if not args.name:
            parser.error(f"{args.command} needs a component name")
        cluster = Cluster.load(folder)
        if args.command == "start":
            print(cluster.start(args.name))
        elif args.command == "stop":
            cluster.stop(args.name)
        else:
            cluster.signal(args.name, signal.SIGKILL, timeout=10)
        return 0
    except ClusterError as exc:
        print(f"local-cluster: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
