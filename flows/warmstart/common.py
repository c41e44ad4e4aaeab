"""What the shim and the zygote share: the key, the private folder, the wire, the exit code.

Standard library only, and only cheap modules of it: the shim imports this on every flow run's
start (tests/test_warm_start.py checks the shim's imports).

The key
    One zygote serves the flow runs whose process would have started the same: the same
    interpreter (path, version, options), user, groups, umask, limits, cgroup, namespaces and
    niceness, and the same environment *apart from the per-run variables*: every ``PREFECT__*``
    name (two underscores: the runner's own namespace, never a setting; in Prefect 3.9.1 the
    worker and its starter set PREFECT__FLOW_RUN_ID, PREFECT__CONTROL_PORT,
    PREFECT__CONTROL_TOKEN, PREFECT__DEPLOYMENT_NAME, PREFECT__DEPLOYMENT_ID,
    PREFECT__FLOW_ENTRYPOINT, PREFECT__FLOW_ID, PREFECT__FLOW_NAME, PREFECT__STORAGE_BASE_PATH,
    PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS, PREFECT__WORKER_ID, PREFECT__WORKER_NAME,
    all read when a run needs them, none at import), and a shell's PWD, OLDPWD, SHLVL and
    ``_``. The working folder is not in it: each fork changes to the run's own. The fork gets
    the shim's whole environment anyway; the key only guarantees that what the zygote computed
    at import from its environment is what the run's own process would have computed.

The folder
    ``$COLLECTOR_WARM_DIR``, else ``$XDG_RUNTIME_DIR/collector-warm``, else
    ``$TMPDIR/collector-warm-<uid>`` (``/tmp`` without TMPDIR): created 0700, and used only if it
    is a real folder of this user that nobody else can open. Per key: ``<key>.sock`` (the
    zygote's socket), ``<key>.lock`` (held by the zygote that owns the socket), ``<key>.pid``,
    ``<key>.log`` (the zygote's output and one line per fork).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import stat
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence

TYPE_CHECKING = False  # not `from typing import TYPE_CHECKING`: `typing` costs the shim 2 ms

if TYPE_CHECKING:
    from typing import Any

PROTOCOL = 1
PER_RUN_PREFIX = "PREFECT__"
# set by a shell for the folder it is in and the command it ran: say nothing about a run's code
NOT_KEYED = frozenset({"PWD", "OLDPWD", "_", "SHLVL"})
DIR_VARIABLE = "COLLECTOR_WARM_DIR"
IDLE_VARIABLE = "COLLECTOR_WARM_IDLE_S"
DEFAULT_IDLE_S = 600.0  # a zygote with no run and no request this long exits
ZYGOTE_MODULE = "flows.warmstart.zygote"
SHIM_MODULE = "flows.warmstart"
ENGINE_MODULE = "prefect.engine"
MAX_MESSAGE = 4 << 20  # a request is an environment and a few paths: far below this
# what the shim hands over, in this order (SCM_RIGHTS)
FDS = ("stdin", "stdout", "stderr", "life", "report")
# signals the shim passes on to the run (SIGKILL cannot be caught: the life pipe covers it)
FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGCONT")


class Unsafe(Exception):
    """The private folder is not private (or not usable): start cold."""


class Paths:
    """A zygote's files in the private folder."""

    __slots__ = ("lock", "log", "pid", "socket")

    def __init__(self, base: str) -> None:
        self.socket = base + ".sock"
        self.lock = base + ".lock"
        self.pid = base + ".pid"
        self.log = base + ".log"


def is_per_run(name: str) -> bool:
    """A variable that is not part of the key: one the worker sets per flow run, or a shell's
    note of the folder and command (the working folder is not in the key either)."""
    return name.startswith(PER_RUN_PREFIX) or name in NOT_KEYED


def interpreter_options(orig_argv: Sequence[str]) -> list[str]:
    """The interpreter's own options in ``orig_argv`` (``[python, *options, "-m", module]``)."""
    options: list[str] = []
    args = iter(orig_argv[1:])
    for arg in args:
        if arg in ("-m", "-c", "-") or not arg.startswith("-"):
            break
        options.append(arg)
        if arg in ("-X", "-W"):  # an option with its value apart: `-X importtime`
            options.append(next(args, ""))
    return options


def identity() -> list[Any]:
    """This process's interpreter and what it inherited besides its environment (in the key)."""
    import resource

    mask = os.umask(0o22)
    os.umask(mask)
    limits = []
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_")):
        with contextlib.suppress(OSError, ValueError):
            limits.append([name, *resource.getrlimit(getattr(resource, name))])
    spaces = []
    for space in ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup"):
        with contextlib.suppress(OSError):
            spaces.append(os.readlink(f"/proc/self/ns/{space}"))
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as cgroup:
            group = cgroup.read()
    except OSError:
        group = ""
    return [
        PROTOCOL,
        sys.executable,
        interpreter_options(getattr(sys, "orig_argv", [])),
        sys.version,
        os.getuid(),
        os.getgid(),
        sorted(os.getgroups()),
        mask,
        limits,
        spaces,
        group,
        os.getpriority(os.PRIO_PROCESS, 0),
    ]


def key(env: Mapping[str, str], ident: Sequence[Any]) -> str:
    """The zygote this environment and identity may use (32 hex digits)."""
    kept = sorted((k, v) for k, v in env.items() if not is_per_run(k))
    text = json.dumps([list(ident), kept], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


def zygote_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a zygote starts with: the shim's without the per-run variables."""
    return {k: v for k, v in env.items() if not is_per_run(k)}


def runtime_dir(env: Mapping[str, str]) -> str:
    """The private folder of this user's zygotes, created if missing (:class:`Unsafe` if it
    cannot be trusted)."""
    uid = os.getuid()
    folder = env.get(DIR_VARIABLE)
    if not folder:
        xdg = env.get("XDG_RUNTIME_DIR")
        if xdg and _private(xdg, uid, strict=False):
            folder = os.path.join(xdg, "collector-warm")
        else:
            folder = os.path.join(env.get("TMPDIR") or "/tmp", f"collector-warm-{uid}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise Unsafe(f"{folder}: {exc}") from None
    if not _private(folder, uid, strict=True):
        raise Unsafe(f"{folder}: not a folder of uid {uid} closed to others")
    return folder


def _private(folder: str, uid: int, *, strict: bool) -> bool:
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
        return False
    return not strict or info.st_mode & 0o077 == 0


def paths(folder: str, zygote_key: str) -> Paths:
    where = Paths(os.path.join(folder, zygote_key))
    if len(os.fsencode(where.socket)) + 16 > 107:  # a unix socket's path (with the temporary's)
        raise Unsafe(f"{folder}: too long a path for a unix socket")
    return where


def idle_s(env: Mapping[str, str]) -> float:
    try:
        return max(1.0, float(env.get(IDLE_VARIABLE, "") or DEFAULT_IDLE_S))
    except ValueError:
        return DEFAULT_IDLE_S


# --- the wire: length-prefixed JSON, with file descriptors on the first chunk ---------------------
_HEADER = struct.Struct("!I")


def send_message(sock: socket.socket, message: Mapping[str, Any], fds: Iterable[int] = ()) -> None:
    data = json.dumps(message, separators=(",", ":")).encode("utf-8")
    frame = _HEADER.pack(len(data)) + data
    fds = list(fds)
    sent = socket.send_fds(sock, [frame], fds) if fds else sock.send(frame)
    if sent < len(frame):
        sock.sendall(frame[sent:])


class Channel:
    """Messages from one connection (its buffer keeps what came ahead of a message)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    def receive(self, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
        """The next message and the descriptors that came with it; (None, fds) at end of stream."""
        fds: list[int] = []
        while True:
            if len(self._buffer) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(self._buffer)
                if size > MAX_MESSAGE:
                    raise ValueError(f"message of {size} bytes")
                end = _HEADER.size + size
                if len(self._buffer) >= end:
                    data, self._buffer = self._buffer[_HEADER.size : end], self._buffer[end:]
                    message = json.loads(data)
                    if not isinstance(message, dict):
                        raise ValueError("not a message")
                    return message, fds
            if max_fds and not fds:
                chunk, got, _flags, _addr = socket.recv_fds(self.sock, 65536, max_fds)
                for fd in got:
                    os.set_inheritable(fd, False)  # nothing the run starts may hold them
                fds.extend(got)
            else:
                chunk = self.sock.recv(65536)
            if not chunk:
                return None, fds
            self._buffer += chunk


# --- the exit code: what `python -m prefect.engine` would have given the worker -------------------
def exit_action(code: int) -> tuple[str, int]:
    """How the shim ends for the run's exit code (``os.waitstatus_to_exitcode``: ``-N`` killed by
    signal N): ``("exit", code)``, or ``("signal", N)`` (the shim kills itself with N, so the
    worker reads ``-N`` as it would have from the run's own process)."""
    if code < 0:
        return "signal", -code
    return "exit", code & 0xFF
