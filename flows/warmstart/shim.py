"""The shim: the process a worker starts for a flow run (``<python> -m flows.warmstart``).

1. Signals first: every forwarded signal (common.FORWARDED) is caught from the start; one that
   comes before the run exists is kept and passed on once it does (or, going cold, ends this
   process as it would have ended the cold one).
2. The key (common.key) names the zygote; connect to its socket and send the environment, the
   working folder, the argv, this process's signal state and five descriptors: stdin, stdout,
   stderr, the read end of the *life pipe* (whose write end only this process holds: when it
   dies, however it dies, the run's process reads end-of-file and kills itself) and the write end
   of the *report pipe* (the run writes its exit code there, for the case the zygote died).
3. The zygote answers the run's pid (it forked it) and, when it ended, its exit code. On the pid
   this process writes one byte, "go", into the life pipe: the fork runs nothing of the flow run
   before it reads it, so a shim that gave up waiting (and went cold) never has a twin running.
   From then on every signal this process gets goes to the run. This process then ends as the
   run did: the same exit code, or killed by the same signal (common.exit_action).
4. No zygote, a refusal (its code is stale) or any error before the pid: close the life pipe (a
   fork that did happen dies before running anything), start a zygote for next time (detached,
   its own session) and ``exec`` ``python -m prefect.engine`` in this process: the cold start.

Standard library only (and only what ``common`` imports besides): this runs on every start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys

from flows.warmstart import common

REPLY_TIMEOUT_S = 20.0  # the zygote's pid: a fork, well under a second even on a loaded box


class _Signals:
    """Forwarded signals: to the run once its pid is known, kept until then."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.pending: list[int] = []
        self.numbers = [getattr(signal, n) for n in common.FORWARDED if hasattr(signal, n)]
        self.ignored = [s for s in self.numbers if signal.getsignal(s) == signal.SIG_IGN]

    def install(self) -> None:
        for number in self.numbers:
            if number not in self.ignored:  # ignored here: ignored by the run too, as cold
                signal.signal(number, self._handle)

    def _handle(self, number: int, _frame: object) -> None:
        if self.pid is None:
            self.pending.append(number)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, number)

    def started(self, pid: int) -> None:
        self.pid = pid
        for number in self.pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)
        self.pending.clear()

    def restore(self) -> None:
        for number in self.numbers:
            if number not in self.ignored:
                signal.signal(number, signal.SIG_DFL)


def main(argv: list[str] | None = None) -> int:
    """``python -m flows.warmstart [MODULE [ARG...]]``: run MODULE (``prefect.engine``) as
    ``python -m MODULE ARG...`` would, forked from a zygote when one serves."""
    argv = sys.argv if argv is None else argv
    module, args = (argv[1], argv[2:]) if len(argv) > 1 else (common.ENGINE_MODULE, [])
    signals = _Signals()
    signals.install()
    env = dict(os.environ)
    try:
        folder = common.runtime_dir(env)
        zygote_key = common.key(env, common.identity())
        where = common.paths(folder, zygote_key)
    except (common.Unsafe, OSError) as exc:
        _note(f"warm start unavailable ({exc}); starting cold")
        return _cold(signals, None, module, args)
    life_r, life_w = os.pipe()
    report_r, report_w = os.pipe()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(REPLY_TIMEOUT_S)
        sock.connect(where.socket)
        request = {
            "v": common.PROTOCOL,
            "key": zygote_key,
            "env": env,
            "cwd": os.getcwd(),
            "parent": os.getppid(),  # the worker: the zygote ends once its workers are gone
            "module": module,
            "args": args,
            "ignored": signals.ignored,
            "mask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        }
        common.send_message(sock, request, [0, 1, 2, life_r, report_w])
        os.close(life_r)
        os.close(report_w)
        life_r = report_w = -1
        channel = common.Channel(sock)
        reply, _ = channel.receive()
        if reply is None or "pid" not in reply:
            why = (reply or {}).get("refused", "no answer")
            raise ConnectionError(f"zygote refused: {why}")
        pid = int(reply["pid"])
    except (OSError, ValueError, ConnectionError) as exc:
        # a fork that happened dies before it runs anything: its life pipe is closed here
        for fd in (life_r, life_w, report_r, report_w):
            if fd >= 0:
                os.close(fd)
        sock.close()
        if not isinstance(exc, FileNotFoundError):
            _note(f"no warm start ({exc}); starting cold")
        return _cold(signals, (env, folder, zygote_key, where), module, args)
    signals.started(pid)
    # go: the run waits for it, so it never runs beside a cold start (gone already: its exit
    # code follows)
    with contextlib.suppress(OSError):
        os.write(life_w, b"g")
    sock.settimeout(None)
    code = _wait(channel, report_r)
    # life_w stays open until this process ends: the run is over by now
    return _end(signals, code)


def _wait(channel: common.Channel, report_r: int) -> int:
    """The run's exit code: from the zygote, or (it died meanwhile) from the run itself."""
    try:
        while True:
            reply, _ = channel.receive()
            if reply is None:
                break
            if "exit" in reply:
                return int(reply["exit"])
    except (OSError, ValueError):
        pass
    # the zygote is gone: the run writes its own code before it exits (nothing: it was killed)
    said = b""
    while True:
        try:
            chunk = os.read(report_r, 64)
        except InterruptedError:
            continue
        if not chunk:
            break
        said += chunk
    try:
        return int(said.split()[-1])
    except (ValueError, IndexError):
        return -signal.SIGKILL


def _end(signals: _Signals, code: int) -> int:
    action, value = common.exit_action(code)
    sys.stdout.flush()
    sys.stderr.flush()
    if action == "signal":
        signals.restore()
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the run dumped its own core
        except (ImportError, OSError, ValueError):
            pass
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP refuse: need not
            signal.signal(value, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [value])
        os.kill(os.getpid(), value)
        return 128 + value  # a signal whose default is to go on (SIGCHLD, SIGWINCH): as a shell
    return value


def _cold(
    signals: _Signals,
    start: tuple[dict[str, str], str, str, common.Paths] | None,
    module: str,
    args: list[str],
) -> int:
    """Start a zygote for next time (when there is a folder for it), then become the cold start."""
    if start is not None:
        try:
            _spawn_zygote(*start)
        except OSError as exc:
            _note(f"could not start a zygote ({exc})")
    signals.restore()
    for number in signals.pending:  # a signal before the run: the cold process would have died
        os.kill(os.getpid(), number)
    python = sys.executable
    argv = [python, *common.interpreter_options(getattr(sys, "orig_argv", [])), "-m", module,
            *args]  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(python, argv)
    return 1  # not reached


def _spawn_zygote(env: dict[str, str], folder: str, zygote_key: str, where: common.Paths) -> None:
    """A zygote, detached: its own session, reparented at once (this process becomes the run),
    stdin from /dev/null, stdout and stderr to its log. Two shims may both start one: the one
    that gets the lock serves, the other exits at once (flows/warmstart/zygote.py)."""
    python = sys.executable
    argv = [python, *common.interpreter_options(getattr(sys, "orig_argv", [])), "-m",
            common.ZYGOTE_MODULE, zygote_key, str(os.getppid())]  # fmt: skip
    log = os.open(where.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the intermediate process
            try:
                os.setsid()
                if os.fork() == 0:
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.dup2(log, 1)
                    os.dup2(log, 2)
                    os.closerange(3, 1 << 16)
                    os.chdir(folder)
                    for number in range(1, signal.NSIG):  # the zygote's own dispositions: defaults
                        try:
                            if signal.getsignal(number) not in (signal.SIG_DFL, None):
                                signal.signal(number, signal.SIG_DFL)
                        except (OSError, ValueError):
                            pass
                    signal.pthread_sigmask(signal.SIG_SETMASK, [])
                    os.execve(python, argv, common.zygote_env(env))
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    finally:
        os.close(log)


def _note(text: str) -> None:
    try:
        sys.stderr.write(f"collector warm start: {text}\n")
        sys.stderr.flush()
    except OSError:
        pass


if __name__ == "__main__":  # pragma: no cover - `python -m flows.warmstart` runs __main__
    sys.exit(main())
