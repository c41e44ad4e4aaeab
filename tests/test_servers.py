"""The throwaway servers of tests/servers.py end with their fixtures, even when they hang.

A redis-server inside an endless Lua script answers nobody, and a plain SIGTERM left one alive
after its fixture's teardown, eating a core of the shared machine: ``stop`` asks (``SCRIPT
KILL``, ``SHUTDOWN NOSAVE``), then kills. Real servers and real processes, no mocks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
import redis

from tests.servers import RedisServer, end_process

ENDLESS = "while true do end"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _loop_forever(server: RedisServer) -> threading.Thread:
    """An endless script sent from a thread (its client gives up after a short timeout)."""

    def send() -> None:
        client = redis.Redis.from_url(server.url, socket_timeout=0.5)
        try:
            client.eval(ENDLESS, 0)
        except redis.RedisError:
            pass  # the timeout, or the connection cut when the server ends
        finally:
            client.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _refusal(server: RedisServer) -> str:
    """The server's answer to PING once the script runs (the first PINGs may come before)."""
    probe = redis.Redis.from_url(server.url, socket_timeout=10)
    try:
        for _ in range(100):
            try:
                probe.ping()
            except redis.ResponseError as refused:
                return str(refused)
            time.sleep(0.05)
        return "answered PING all along"
    finally:
        probe.close()


def _started(server: RedisServer) -> subprocess.Popen[bytes]:
    process = server._process
    assert process is not None and process.poll() is None
    return process


def test_a_redis_looping_in_a_script_is_gone_after_its_teardown() -> None:
    with RedisServer() as server:
        process = _started(server)
        sender = _loop_forever(server)
        sender.join(timeout=5)  # the script runs; the server answers no one for 5 s
        began = time.monotonic()
    took = time.monotonic() - began
    assert _gone(process.pid) and process.returncode is not None
    assert took < 8, f"teardown took {took:.1f}s"


@pytest.mark.slow  # waits for the server to say BUSY (5 s into the script)
def test_a_busy_redis_is_stopped_by_script_kill_and_shutdown_without_a_kill() -> None:
    with RedisServer() as server:
        process = _started(server)
        _loop_forever(server)
        assert "BUSY" in _refusal(server)  # 5 s into the script it answers again, refusing
        server.stop(grace_s=20)
        assert process.returncode == 0  # SHUTDOWN NOSAVE ended it, not SIGKILL
    assert _gone(process.pid)


def test_a_plain_redis_stops_when_asked_not_killed() -> None:
    with RedisServer() as server:
        process = _started(server)
        redis.Redis.from_url(server.url).set("k", "v")
    assert process.returncode == 0


def test_a_process_that_ignores_the_request_is_killed_after_the_grace() -> None:
    """The rule every server fixture uses (Postgres: fast shutdown, SIGINT, then SIGKILL)."""
    process = subprocess.Popen([
        sys.executable, "-c",
        "import signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)",
    ], stdout=subprocess.PIPE)  # fmt: skip
    assert process.stdout is not None and process.stdout.readline() == b"ready\n"
    began = time.monotonic()
    end_process(process, lambda: process.send_signal(2), grace_s=0.5)
    assert process.returncode == -9 and time.monotonic() - began < 5
    process.stdout.close()
