"""Warm starts (flows/warmstart): a flow run's process forked from a pre-started interpreter.

Fast: the key (per-run variables never change it, any other variable does), the exit code the
shim ends with (the run's own, or the run's signal), the wire, the private folder, and that
the shim imports only the standard library.

Slow, on real processes without Prefect (``python -m flows.warmstart tests.warm_target ...``:
the shim runs any module as ``python -m`` would; tests/warm_target.py does what its arguments
say): the second start is a fork of the zygote, exit codes and signals are the cold ones, a
SIGKILLed shim leaves no orphan, a zygote killed mid-run still gets its run's code to the shim,
a code change makes the zygote refuse (cold, then a fresh zygote), another environment gets
another zygote, shims racing to start one leave one.

Slow, on a real process worker (``prefect_api``, tests/fleet_world.py's ``Pool``, sources
deployed by ``collector deploy``): the helpers of the fleet started warm, Completed with an
exact, balanced ledger; cancelled from the API; the shim SIGKILLed; cold fallbacks.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.deploy import portable_warm_command
from flows.warmstart import common, zygote

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

# --- fast: the key -------------------------------------------------------------------------------
IDENT = ["fixed", "identity"]
names = st.text(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789"), min_size=1, max_size=12)
values = st.text(max_size=20)
environments = st.dictionaries(names, values, max_size=12)
PER_RUN = (
    "PREFECT__FLOW_RUN_ID", "PREFECT__CONTROL_PORT", "PREFECT__CONTROL_TOKEN",
    "PREFECT__DEPLOYMENT_NAME", "PREFECT__DEPLOYMENT_ID", "PREFECT__FLOW_ENTRYPOINT",
    "PREFECT__FLOW_ID", "PREFECT__FLOW_NAME", "PREFECT__STORAGE_BASE_PATH",
    "PREFECT__ENABLE_CANCELLATION_AND_CRASHED_HOOKS", "PREFECT__WORKER_ID", "PREFECT__WORKER_NAME",
)  # fmt: skip  # what Prefect 3.9.1's worker and starter set per flow run


@given(environments, st.dictionaries(st.sampled_from(PER_RUN) | names.map("PREFECT__".__add__),
                                     values))  # fmt: skip
def test_per_run_variables_never_change_the_key(
    env: dict[str, str], per_run: dict[str, str]
) -> None:
    base = {k: v for k, v in env.items() if not k.startswith("PREFECT__")}
    assert common.key({**base, **per_run}, IDENT) == common.key(base, IDENT)


@given(environments, names, values)
def test_any_other_variable_changes_the_key(env: dict[str, str], name: str, value: str) -> None:
    if name.startswith("PREFECT__") or name in common.NOT_KEYED:
        return
    changed = {**env, name: value}
    if changed != env:  # set or changed
        assert common.key(changed, IDENT) != common.key(env, IDENT)
    without = {k: v for k, v in env.items() if k != name}
    if without != env:  # removed
        assert common.key(without, IDENT) != common.key(env, IDENT)


def test_the_identity_is_in_the_key_and_a_prefect_setting_is_not_per_run() -> None:
    env = {"PATH": "/bin", "PREFECT_API_URL": "http://a/api"}
    assert common.key(env, ["python-a"]) != common.key(env, ["python-b"])
    assert common.key(env, IDENT) != common.key({**env, "PREFECT_API_URL": "http://b/api"}, IDENT)
    assert common.key(env, IDENT) == common.key({**env, "PWD": "/elsewhere"}, IDENT)
    ident = common.identity()
    assert sys.executable in ident and os.getuid() in ident


def test_the_interpreter_options_are_kept_for_the_cold_start_and_the_zygote() -> None:
    assert common.interpreter_options(["py", "-m", "flows.warmstart"]) == []
    assert common.interpreter_options(["py", "-X", "importtime", "-B", "-m", "x", "-v"]) == [
        "-X", "importtime", "-B"
    ]  # fmt: skip
    assert common.interpreter_options(["py", "-Wignore", "-O", "-m", "x"]) == ["-Wignore", "-O"]


# --- fast: the exit code -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "action"),
    [(0, ("exit", 0)), (1, ("exit", 1)), (3, ("exit", 3)), (255, ("exit", 255)),
     (-15, ("signal", 15)), (-9, ("signal", 9)), (-2, ("signal", 2))],
)  # fmt: skip
def test_the_exit_code_maps_to_an_exit_or_a_signal(code: int, action: tuple[str, int]) -> None:
    assert common.exit_action(code) == action


@pytest.mark.parametrize("code", [0, 1, 3, -15, -9, -2, -11])
def test_the_shim_ends_as_the_run_ended(code: int) -> None:
    """What the worker reads (Popen.returncode) is what the run's own process would have given."""
    end = f"raise SystemExit(_end(_Signals(), {code}))"
    script = f"from flows.warmstart.shim import _Signals, _end; {end}"
    done = subprocess.run([PYTHON, "-c", script], cwd=ROOT, capture_output=True, timeout=60)
    assert done.returncode == code


# --- fast: what `collector deploy` writes ------------------------------------------------------
def test_collector_deploy_starts_warm_by_default_through_the_deploying_interpreter(
    tmp_path: Path,
) -> None:
    import yaml

    from collector.config import load_source
    from collector.errors import ConfigError
    from collector.fleet.deploy import plan_for
    from flows.cli import build_parser
    from flows.cli.deploy import WARM_BY_DEFAULT
    from flows.deploy import prefect_yaml_entry, warm_command

    parser = build_parser()
    assert WARM_BY_DEFAULT and parser.parse_args(["deploy", "a.yaml"]).start is None
    assert parser.parse_args(["deploy", "a.yaml", "--cold-start"]).start == "cold"
    with pytest.raises(SystemExit):  # one or the other
        parser.parse_args(["deploy", "a.yaml", "--cold-start", "--warm-start"])
    assert warm_command() == f"{sys.executable} -m flows.warmstart"
    assert (
        warm_command("/opt/my python/bin/python")
        == "'/opt/my python/bin/python' -m flows.warmstart"
    )
    with pytest.raises(ConfigError, match="absolute path"):
        warm_command("python3")
    source = tmp_path / "s.yaml"
    source.write_text(
        "name: s\nseeds: {urls: ['http://127.0.0.1:1/a']}\nrecord: {key: id}\n"
        "sink: {type: jsonl, path: out}\n"
    )
    plan = plan_for(load_source(source), str(source), command=warm_command())
    assert plan.start_text == f"warm start ({warm_command()})"
    entry = yaml.safe_load(prefect_yaml_entry(plan))["deployments"][0]
    assert entry["work_pool"]["job_variables"] == {"command": warm_command()}
    cold = plan_for(load_source(source), str(source))
    assert cold.command is None and cold.start_text == "cold start"
    assert (
        "job_variables"
        not in yaml.safe_load(prefect_yaml_entry(cold))["deployments"][0]["work_pool"]
    )


# --- fast: the wire and the folder ---------------------------------------------------------------
def test_a_message_carries_its_descriptors_and_arrives_whole() -> None:
    """A request (its descriptors on its first chunk, then far more than one socket buffer),
    then the replies, as the shim and the zygote exchange them."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    r, w = os.pipe()
    big = {"env": {f"V{i}": "x" * 200 for i in range(2000)}, "cwd": "/"}  # ~450 KB
    sender = threading.Thread(target=common.send_message, args=(left, big, [r, w]))
    sender.start()
    try:
        channel = common.Channel(right)
        message, fds = channel.receive(max_fds=5)
        sender.join(timeout=30)
        assert message == big and len(fds) == 2
        assert all(not os.get_inheritable(fd) for fd in fds)
        os.write(fds[1], b"ok")
        assert os.read(r, 2) == b"ok"
        for fd in fds:
            os.close(fd)
        replies = common.Channel(left)
        common.send_message(right, {"pid": 12})
        common.send_message(right, {"exit": -15})
        assert replies.receive() == ({"pid": 12}, [])
        assert replies.receive() == ({"exit": -15}, [])
        right.close()
        assert replies.receive() == (None, [])
    finally:
        os.close(r)
        os.close(w)
        left.close()
        right.close()


def test_the_folder_is_private_or_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "warm"
    assert common.runtime_dir({common.DIR_VARIABLE: str(folder)}) == str(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)
    with pytest.raises(common.Unsafe):
        common.runtime_dir({common.DIR_VARIABLE: str(folder)})
    link = tmp_path / "link"
    link.symlink_to(folder)
    folder.chmod(0o700)
    with pytest.raises(common.Unsafe):
        common.runtime_dir({common.DIR_VARIABLE: str(link)})
    with pytest.raises(common.Unsafe):
        common.paths("/" + "x" * 100, "k" * 32)


def _imported(code: str) -> set[str]:
    done = subprocess.run([PYTHON, "-X", "importtime", "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.split("|")[-1].strip() for line in lines[1:]}  # the first: the header


def test_the_shim_imports_only_the_standard_library() -> None:
    """The shim runs on every start: beyond what the interpreter imports anyway, only the
    standard library and its own three modules (flows/__init__ is a docstring)."""
    extra = _imported("import flows.warmstart.shim") - _imported("pass")
    ours = {m for m in extra if m.split(".")[0] not in sys.stdlib_module_names}
    assert ours == {"flows", "flows.warmstart", "flows.warmstart.common", "flows.warmstart.shim"}
    assert not extra & {"typing", "asyncio", "subprocess", "tempfile"}  # and nothing costly


# --- slow: real shims and zygotes, no Prefect run ------------------------------------------------
@pytest.fixture
def warm_env() -> Iterator[dict[str, str]]:
    """An environment whose zygotes live in a folder of this test's (short: a socket's path),
    killed at the end."""
    folder = tempfile.mkdtemp(prefix="cw-", dir="/tmp")
    env = {**os.environ, common.DIR_VARIABLE: folder, common.IDLE_VARIABLE: "120"}
    try:
        yield env
    finally:
        stop_zygotes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def stop_zygotes(folder: str) -> None:
    pids = []
    for path in Path(folder).glob("*.pid"):
        try:
            pids.append(int(path.read_text()))
            os.kill(pids[-1], signal.SIGTERM)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 30
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if _alive(p)]
        time.sleep(0.1)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (a reaped child of nobody yet) is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def shim(env: dict[str, str], *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "flows.warmstart", "tests.warm_target", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, **kwargs,
    )  # fmt: skip


def started_shim(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, "-m", "flows.warmstart", "tests.warm_target", *args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def ended(running: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    """A started shim's exit code and stderr, once it ended."""
    _, err = running.communicate(timeout=timeout)
    return running.returncode, err


def zygotes(env: dict[str, str]) -> dict[str, int]:
    """The zygotes serving in the test's folder: key -> pid."""
    return serving(env[common.DIR_VARIABLE])


def serving(folder: str) -> dict[str, int]:
    """The zygotes serving in ``folder``: key -> pid."""
    found = {}
    for path in Path(folder).glob("*.pid"):
        try:
            pid = int(path.read_text())
        except ValueError:
            continue
        if _alive(pid) and path.with_suffix(".sock").exists():
            found[path.stem] = pid
    return found


def wait_for(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def warm_up(env: dict[str, str]) -> int:
    """Start the key's zygote with a first (cold) run; its pid once it serves."""
    first = shim(env, "exit", "0")
    assert first.returncode == 0, first.stderr
    return int(wait_for("a zygote", lambda: next(iter(zygotes(env).values()), None)))


def facts(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = wait_for(
        f"{path}", lambda: path.exists() and json.loads(path.read_text())
    )
    return found


@pytest.mark.slow
def test_the_second_start_is_a_fork_of_the_zygote_and_ends_as_the_cold_one(
    warm_env: dict[str, str], tmp_path: Path
) -> None:
    zygote = warm_up(warm_env)
    marker = tmp_path / "facts"
    done = shim({**warm_env, "PREFECT__FLOW_RUN_ID": "run-1"}, "wait-none", str(marker))
    assert done.returncode != 0  # unknown action: SystemExit with a message, as cold
    cold = subprocess.run([PYTHON, "-m", "tests.warm_target", "wait-none"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert (done.returncode, done.stderr.strip()) == (cold.returncode, cold.stderr.strip())
    for args in (["exit", "0"], ["exit", "3"], ["raise"], ["interrupt"], ["kill", "15"],
                 ["kill", "9"]):  # fmt: skip
        warm = shim(warm_env, *args)
        cold = subprocess.run([PYTHON, "-m", "tests.warm_target", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert warm.returncode == cold.returncode, (args, warm.stderr)
        assert warm.stdout == cold.stdout
    # a run started with a per-run variable set is still a fork of the same zygote
    running = started_shim({**warm_env, "PREFECT__FLOW_RUN_ID": "run-2"}, "wait", str(marker))
    seen = facts(marker)
    assert seen["ppid"] == zygote and seen["sid"] == seen["pid"]  # its own session
    assert seen["cwd"] == str(ROOT) and seen["argv"][1:] == ["wait", str(marker)]
    running.send_signal(signal.SIGTERM)  # forwarded: the run's own handler ends it
    assert ended(running, 60)[0] == 0
    assert Path(str(marker) + ".term").exists()
    log = Path(warm_env[common.DIR_VARIABLE], f"{next(iter(zygotes(warm_env)))}.log").read_text()
    assert "forked" in log and "flow run run-2" in log
    assert zygotes(warm_env) == {next(iter(zygotes(warm_env))): zygote}  # one zygote served all


@pytest.mark.slow
def test_a_sigkilled_shim_leaves_no_orphan(warm_env: dict[str, str], tmp_path: Path) -> None:
    warm_up(warm_env)
    marker = tmp_path / "facts"
    running = started_shim(warm_env, "sleep", str(marker))
    child = facts(marker)["pid"]
    assert _alive(child)
    running.kill()
    assert ended(running, 30)[0] == -signal.SIGKILL
    wait_for("the run to die with its shim", lambda: not _alive(child), timeout=10)


@pytest.mark.slow
def test_a_run_whose_zygote_died_still_ends_with_its_own_code(
    warm_env: dict[str, str], tmp_path: Path
) -> None:
    zygote = warm_up(warm_env)
    marker = tmp_path / "facts"
    running = started_shim(warm_env, "wait", str(marker))
    child = facts(marker)["pid"]
    os.kill(zygote, signal.SIGKILL)
    wait_for("the zygote to die", lambda: not _alive(zygote), timeout=10)
    assert _alive(child)  # the run goes on without it
    running.send_signal(signal.SIGTERM)
    assert ended(running, 60)[0] == 0  # from the report pipe
    # the next start finds a dead socket: cold, and a fresh zygote for later
    assert shim(warm_env, "exit", "5").returncode == 5
    fresh = wait_for("a fresh zygote", lambda: next(iter(zygotes(warm_env).values()), None))
    assert fresh != zygote


@pytest.mark.slow
def test_changed_code_is_refused_and_run_cold_then_a_fresh_zygote_serves(
    warm_env: dict[str, str], tmp_path: Path
) -> None:
    zygote = warm_up(warm_env)
    marker = tmp_path / "facts"
    os.utime(ROOT / "flows" / "warmstart" / "__init__.py")  # an edit, as far as mtimes go
    running = started_shim(warm_env, "wait", str(marker))
    seen = facts(marker)
    assert seen["pid"] == running.pid  # cold: the shim became the run (exec)
    running.send_signal(signal.SIGTERM)
    code, err = ended(running)
    assert code == 0
    assert "zygote refused: stale" in err
    wait_for("the stale zygote to exit", lambda: not _alive(zygote), timeout=30)
    fresh = wait_for("a fresh zygote", lambda: next(iter(zygotes(warm_env).values()), None))
    marker.unlink()
    running = started_shim(warm_env, "wait", str(marker))
    assert facts(marker)["ppid"] == fresh
    running.send_signal(signal.SIGTERM)
    assert ended(running, 60)[0] == 0


@pytest.mark.slow
def test_another_environment_gets_another_zygote_and_no_zygote_runs_cold(
    warm_env: dict[str, str], tmp_path: Path
) -> None:
    first = warm_up(warm_env)
    other = {**warm_env, "SOME_SETTING": "other"}
    marker = tmp_path / "facts"
    running = started_shim(other, "wait", str(marker))
    assert facts(marker)["pid"] == running.pid  # no zygote for this key yet: cold
    running.send_signal(signal.SIGTERM)
    assert ended(running, 60)[0] == 0
    found = wait_for("two zygotes", lambda: len(zygotes(warm_env)) == 2 and zygotes(warm_env))
    second = next(pid for pid in found.values() if pid != first)
    marker.unlink()
    running = started_shim(other, "wait", str(marker))
    seen = facts(marker)
    assert seen["ppid"] == second
    running.send_signal(signal.SIGTERM)
    assert ended(running, 60)[0] == 0


@pytest.mark.slow
def test_shims_racing_to_start_a_zygote_leave_one(warm_env: dict[str, str]) -> None:
    racing = [started_shim(warm_env, "exit", "0") for _ in range(6)]
    assert [ended(p, 120)[0] for p in racing] == [0] * 6
    wait_for("a zygote", lambda: zygotes(warm_env))

    def alive() -> list[int]:
        pids = [int(p.read_text()) for p in Path(warm_env[common.DIR_VARIABLE]).glob("*.pid")]
        return [p for p in pids if _alive(p)]

    # the losers exit at once, before importing anything: one zygote left (two that stay fail
    # here when the wait runs out)
    wait_for("one zygote left", lambda: len(alive()) == 1, timeout=30)
    assert shim(warm_env, "exit", "7").returncode == 7


@pytest.mark.slow
def test_a_zygote_ends_once_the_workers_it_served_are_gone(warm_env: dict[str, str]) -> None:
    """Its "worker" here is a shell that exits after its one run: the zygote that run started
    exits by itself (idle 120 s here: not the idle rule), as one does when its worker stops."""
    log = Path(warm_env[common.DIR_VARIABLE])
    command = f"{PYTHON} -m flows.warmstart tests.warm_target exit 0; true"  # sh stays its parent
    assert (
        subprocess.run(["sh", "-c", command], cwd=ROOT, env=warm_env, timeout=120).returncode == 0
    )
    wait_for("the zygote to start", lambda: list(log.glob("*.log")) and "preloaded" in
             next(log.glob("*.log")).read_text())  # fmt: skip
    wait_for("the zygote to end", lambda: "the workers it served are gone" in
             next(log.glob("*.log")).read_text() and not zygotes(warm_env), timeout=60)  # fmt: skip


# --- slow: a real process worker ----------------------------------------------------------------
ITEMS = 150
# A source whose own run outlasts a warm helper's start (a fork: a helper claimed ~5 s after the
# plan at load 13) by far, and little more: once its helper is cancelled or killed, the own run
# fetches the rest alone (it was 200 items, ~55 s of the run alone at load 13). Pages answer in
# 0.3 s: at 0.2 s a run fetching ahead (collector.run.drain, 1.36 x a process's pace) drained the
# source at load 10 before the second helper's fork claimed (a full run, 2026-12-06). Fewer,
# slower pages (0.4 x the items at 0.75 s: the same time a source lasts on a quiet box) did not
# hold on a loaded one: a run CPU-bound at 0.3 s a page lasts longer there than its pages'
# time, and at 0.75 s it does not (a full run, 2026-12-06 13:00).
SHORT_ITEMS = 120


@pytest.fixture(scope="module")
def _module_pool(prefect_api: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """tests/fleet_world.py's Pool (a process worker of a pool of its own), its zygotes in a
    folder of the module's (the worker's environment has it, so the key does).

    One worker for the module: each test used to start its own (a fresh Python importing
    Prefect, then seconds to stop it); ``warm_pool`` gives each test the folder empty, no
    zygote serving, as a fresh worker had it."""
    from tests.fleet_world import Pool

    folder = tempfile.mkdtemp(prefix="cw-", dir="/tmp")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(common.DIR_VARIABLE, folder)
        env.setenv(common.IDLE_VARIABLE, "300")
        pool = Pool(prefect_api, tmp_path_factory.mktemp("pool"))
        pool.start()
        try:
            yield pool
        finally:
            pool.stop()
            stop_zygotes(folder)
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def warm_pool(_module_pool: Any) -> Iterator[Any]:
    """The module's worker, its zygote folder empty: no zygote serves when the test starts
    (its first run starts cold), and none of this test's is left for the next."""
    folder = os.environ[common.DIR_VARIABLE]
    _empty(folder)
    try:
        yield _module_pool
    finally:
        _empty(folder)


def _empty(folder: str) -> None:
    """Stop the folder's zygotes and remove what they left (pid, socket, log files)."""
    stop_zygotes(folder)
    for item in Path(folder).iterdir():
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.unlink(missing_ok=True)


forks = zygote.forked_runs  # flow run id -> its forked pid, from the zygotes' logs


class Scene:
    """One source deployed warm on the pool's worker: its own run, helpers started by hand (as
    the fleet starts them), its frontier and sink."""

    def __init__(self, pool: Any, folder: Path, site: str, redis: str, dsn: str, name: str,
                 *, items: int = ITEMS, delay_s: float = 0.3) -> None:  # fmt: skip
        from collector.backends import open_frontier
        from collector.config import load_source
        from tests.fleet_world import Spec, _deployment_ids, deploy, write_source

        self.pool = pool
        self.name = name
        self.items = items
        self.dsn = dsn
        self.path = write_source(folder, Spec(name, "normal", items, delay_s, 2), site, redis, dsn)
        self.written = deploy(str(self.path), "--pool", pool.name, "--batch-size", "3",
                              "--warm-start")  # fmt: skip
        self.deployment_id = next(iter(_deployment_ids([name])))
        self.frontier = open_frontier(load_source(self.path))
        self.warm_dir = os.environ[common.DIR_VARIABLE]

    def close(self) -> None:
        self.frontier.close()

    def run(self) -> Any:
        from prefect.deployments import run_deployment

        from collector.fleet.deploy import deployment_name

        return run_deployment(f"collect/{deployment_name(self.name)}", timeout=0)

    def helper(self) -> Any:
        """One helper, as the fleet starts it (flows/fleet.py ``_start``); its flow run."""
        from prefect.client.orchestration import get_client

        from flows.fleet import HELPER_TAG
        from tests.fleet_world import BATCH, HELPER_IDLE_S

        async def start() -> Any:
            async with get_client() as client:
                return await client.create_flow_run_from_deployment(
                    self.deployment_id,
                    parameters={"source": str(self.path), "role": "work",
                                "idle_wait_s": HELPER_IDLE_S, "drain_wait_s": HELPER_IDLE_S,
                                "batch_size": BATCH},
                    tags=[HELPER_TAG, f"source:{self.name}"],
                )  # fmt: skip

        return asyncio.run(start())

    def claiming_helper(self) -> Any:
        """Once the source's own run planned, one helper; returned when it holds leases."""
        self.pool.wait_for("the plan", self.planned)
        helper = self.helper()
        self.pool.wait_for("the helper to claim", lambda: self.holding(helper))
        return helper

    def holding(self, run: Any) -> bool:
        return any(h.holder == str(run.id) and h.leased for h in self.frontier.holders(self.name))

    def left(self) -> int:
        """Items queued or leased: the work a helper could still claim."""
        counts = self.frontier.counts(self.name)
        return counts.queued + counts.leased

    def planned(self) -> bool:
        return self.frontier.counts(self.name).queued > 0

    def end(self, run: Any) -> Any:
        from tests.fleet_world import ended

        return self.pool.wait_for(f"{run.name} to end", ended(run))

    def zygote(self) -> int:
        pids = self.pool.wait_for("a zygote", lambda: serving(self.warm_dir))
        return int(next(iter(pids.values())))

    def exact(self, runs: list[Any], *, counted: bool = True) -> dict[Any, dict[str, Any]]:
        """Every item stored once in the sink; every run's ledger balanced; the ledgers' stored
        items add up to the source's (``counted``: no run among them died without its ledger)."""
        import psycopg

        from tests.fleet_world import ledgers

        with psycopg.connect(self.dsn) as conn:
            keys = [int(k) for (k,) in conn.execute(
                "SELECT key FROM records WHERE source = %s", (self.name,)).fetchall()]  # fmt: skip
        assert sorted(keys) == list(range(self.items))
        tables = ledgers([r.id for r in runs])
        assert sorted(map(str, tables)) == sorted(str(r.id) for r in runs), tables
        assert all(t["balanced"] is True for t in tables.values()), tables
        if counted:
            assert sum(t["stored"] for t in tables.values()) == self.items, tables
        return tables

    def job_variables(self) -> dict[str, Any]:
        from prefect.client.orchestration import get_client

        async def read() -> Any:
            async with get_client() as client:
                return await client.read_deployment(self.deployment_id)

        return dict(asyncio.run(read()).job_variables or {})

    def infrastructure_pid(self, run: Any) -> int:
        """The pid the worker started for ``run`` (the shim's): its ``infrastructure_pid``."""
        from prefect.client.orchestration import get_client

        async def read() -> Any:
            async with get_client() as client:
                return await client.read_flow_run(run.id)

        found = self.pool.wait_for(
            "the run's process id", lambda: asyncio.run(read()).infrastructure_pid
        )
        return int(str(found).rsplit(":", 1)[-1])


def _state(run: Any) -> str:
    return str(run.state.type.value)


@pytest.mark.slow
def test_helpers_start_warm_on_a_process_worker_and_the_source_ends_exact(
    warm_pool: Any, tmp_path: Path, redis_url: str, postgres_dsn: str
) -> None:
    """The source's run starts cold (no zygote yet: its shim starts one); the helpers started
    after it are forks of that zygote; everything Completed, every ledger balanced, each record
    once."""
    from collector.demo.site import FaultSite

    with FaultSite() as site:
        # two helpers one after another, each a worker's pick-up and a fork on a loaded box:
        # 250 items keep the source busy past the second (at 150 a full run's load drained it
        # while the second was still Scheduled)
        scene = Scene(warm_pool, tmp_path, site.base_url, redis_url, postgres_dsn, "warm-a",
                      items=250)  # fmt: skip
        try:
            assert scene.written[0]["command"] == portable_warm_command()
            own = scene.run()
            zygote = scene.zygote()  # started by the run's shim, which went cold
            warm_pool.wait_for("the plan", scene.planned)
            helpers = []
            for _ in range(2):  # one after another, as the fleet starts them
                helper = scene.helper()
                warm_pool.wait_for(
                    "the helper to claim or the source to drain",
                    lambda h=helper: scene.holding(h) or not scene.left(),
                )
                assert scene.holding(helper), "the source drained before the helper claimed"
                helpers.append(helper)
            finals = [scene.end(r) for r in [own, *helpers]]
            assert [_state(r) for r in finals] == ["COMPLETED"] * 3, [
                (r.name, r.state.message) for r in finals
            ]
            forked = forks(scene.warm_dir)
            assert str(own.id) not in forked  # the first start: cold
            assert all(str(h.id) in forked for h in helpers), (forked, warm_pool.log.read_text())
            assert serving(scene.warm_dir) == {next(iter(serving(scene.warm_dir))): zygote}
            tables = scene.exact([own, *helpers])
            assert all(tables[h.id]["stored"] > 0 for h in helpers), tables  # both helped
            assert scene.job_variables() == {"command": portable_warm_command()}
            from tests.fleet_world import deploy

            deploy(str(scene.path), "--pool", warm_pool.name, "--cold-start")
            assert scene.job_variables() == {}  # deploying again cold takes the command off
        finally:
            scene.close()


@pytest.mark.slow
def test_a_warm_helper_cancelled_from_the_api_stops_gracefully_and_a_rerun_is_exact(
    warm_pool: Any, tmp_path: Path, redis_url: str, postgres_dsn: str
) -> None:
    """Cancelling, as the UI sets it: the worker's control message and SIGTERM reach the fork
    through the shim; the helper stops on its own stop path (Cancelled, its leased items back
    unchanged, its ledger balanced), its process ends; the run and a rerun end exact."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelling

    from collector.demo.site import FaultSite

    with FaultSite() as site:
        scene = Scene(warm_pool, tmp_path, site.base_url, redis_url, postgres_dsn, "warm-b",
                      items=SHORT_ITEMS)  # fmt: skip
        try:
            own = scene.run()
            scene.zygote()
            helper = scene.claiming_helper()
            child = forks(scene.warm_dir)[str(helper.id)]  # warm
            assert _alive(child)

            async def cancel() -> None:
                async with get_client() as client:
                    await client.set_flow_run_state(helper.id, Cancelling(message="test: UI"))

            asyncio.run(cancel())
            stopped = scene.end(helper)
            assert _state(stopped) == "CANCELLED", stopped.state.message
            wait_for("the fork to end", lambda: not _alive(child), timeout=30)
            assert not scene.holding(helper)  # its leased items went back
            assert _state(scene.end(own)) == "COMPLETED"
            rerun = scene.run()
            assert _state(scene.end(rerun)) == "COMPLETED"
            tables = scene.exact([own, helper, rerun])
            assert tables[helper.id]["stored"] > 0, tables  # it had helped before it stopped
        finally:
            scene.close()


@pytest.mark.slow
def test_a_sigkilled_shim_takes_its_fork_with_it_and_the_leases_come_back(
    warm_pool: Any, tmp_path: Path, redis_url: str, postgres_dsn: str
) -> None:
    """SIGKILL of the process the worker started (the shim): the fork reads the end of its life
    pipe and kills itself (no orphan runs the flow); the worker marks the helper Crashed as for
    any killed process; the run takes the dead helper's leases back and ends exact."""
    from collector.demo.site import FaultSite

    with FaultSite() as site:
        scene = Scene(warm_pool, tmp_path, site.base_url, redis_url, postgres_dsn, "warm-c",
                      items=SHORT_ITEMS)  # fmt: skip
        try:
            own = scene.run()
            scene.zygote()
            helper = scene.claiming_helper()
            child = forks(scene.warm_dir)[str(helper.id)]
            shim_pid = scene.infrastructure_pid(helper)
            assert shim_pid != child and _alive(shim_pid) and _alive(child)
            os.kill(shim_pid, signal.SIGKILL)
            wait_for("the fork to die with its shim", lambda: not _alive(child), timeout=10)
            killed = scene.end(helper)
            assert _state(killed) == "CRASHED", killed.state.message
            done = scene.end(own)
            assert _state(done) == "COMPLETED", done.state.message
            rerun = scene.run()
            assert _state(scene.end(rerun)) == "COMPLETED"
            # the helper's ledger died with it: each record once, the others' ledgers balanced
            tables = scene.exact([own, rerun], counted=False)
            assert sum(t["stored"] for t in tables.values()) <= scene.items, tables
        finally:
            scene.close()


@pytest.mark.slow
def test_changed_code_starts_cold_and_a_fresh_zygote_serves_the_next_helper(
    warm_pool: Any, tmp_path: Path, redis_url: str, postgres_dsn: str
) -> None:
    """The zygote refuses once the code on disk changed: that helper starts cold and still
    completes, a fresh zygote serves the next one. (A worker with another environment gets a
    zygote of its own: the key is the shim's environment, which is its worker's;
    test_another_environment_gets_another_zygote_and_no_zygote_runs_cold proves it on the
    shim. A second process worker here cost a Prefect worker's start, a cold run and a zygote's
    imports for the same code path.)"""
    from collector.demo.site import FaultSite

    with FaultSite() as site:
        scene = Scene(warm_pool, tmp_path, site.base_url, redis_url, postgres_dsn, "warm-d",
                      items=400)  # fmt: skip
        try:
            own = scene.run()
            first = scene.zygote()
            warm = scene.claiming_helper()
            assert str(warm.id) in forks(scene.warm_dir)

            os.utime(ROOT / "flows" / "warmstart" / "__init__.py")  # the code changed on disk
            cold = scene.helper()
            warm_pool.wait_for("the cold helper to claim", lambda: scene.holding(cold))
            assert str(cold.id) not in forks(scene.warm_dir)  # refused: started cold
            fresh = warm_pool.wait_for(
                "a fresh zygote", lambda: next((p for p in serving(scene.warm_dir).values()
                                                if p != first), None))  # fmt: skip
            again = scene.helper()
            warm_pool.wait_for("the next helper to start", lambda: str(again.id) in forks(
                scene.warm_dir))  # fmt: skip
            assert _parent_of(forks(scene.warm_dir), str(again.id), scene.warm_dir) == fresh

            finals = [scene.end(r) for r in (own, warm, cold, again)]
            assert [_state(r) for r in finals] == ["COMPLETED"] * 4, [
                (r.name, r.state.message) for r in finals
            ]
            scene.exact([own, warm, cold, again])
        finally:
            scene.close()


def _parent_of(forked: dict[str, int], run_id: str, folder: str) -> int | None:
    """The pid of the zygote whose log says it forked ``run_id``."""
    for log in Path(folder).glob("*.log"):
        for line in log.read_text().splitlines():
            if line.endswith(f" for flow run {run_id}") and " forked " in line:
                return int(line.split(" zygote ", 1)[1].split(":", 1)[0])
    return None
