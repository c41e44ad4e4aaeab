"""The default warm-start command finds an interpreter on the worker, or says why not.

``collector deploy`` writes ``/bin/sh -c '<try the deploying python, then python3, python>'
<deploying python>`` (flows/deploy.py ``portable_warm_command``): a worker in a container has
the image's Python, not the host's virtual environment the deployment was made from. These
tests run the command exactly as Prefect's process worker would (``command_from_string``, no
shell of ours around it), from a temporary folder, with ``tests.warm_target`` instead of
Prefect's engine as the module. Each interpreter is a small wrapper that notes its name and
execs this Python. The warm-start folder is made unusable, so every shim starts cold at once
(no zygote to clean up): what is under test is which interpreter runs the shim, not the fork.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.deploy import (
    WARM_BUILD_STEP,
    WARM_FROM_BUILD_STEP,
    WARM_MODULE,
    portable_warm_command,
    warm_command,
)
from flows.warmstart import common

ROOT = Path(__file__).resolve().parents[1]


def _wrapper(path: Path, name: str, marks: Path) -> Path:
    """An interpreter called ``path`` that notes ``name`` in ``marks`` and runs this Python."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho {name} >> "{marks}"\nexec "{sys.executable}" "$@"\n')
    path.chmod(0o755)
    return path


class _Worker:
    """What a process worker gives the command: a temporary folder, its environment."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.marks = tmp_path / "marks"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        unsafe = tmp_path / "warm"  # open to all: the shim refuses it and starts cold at once
        unsafe.mkdir(mode=0o777)
        unsafe.chmod(0o777)
        self.env = {
            "PATH": str(self.bin),  # only the wrappers: sh and its builtins need no PATH
            "PYTHONPATH": str(ROOT),  # the checkout's tests.warm_target and flows
            common.DIR_VARIABLE: str(unsafe),
            "HOME": str(tmp_path),
        }
        self.cwd = tmp_path / "run"
        self.cwd.mkdir()

    def argv(self, command: str, *module_args: str) -> list[str]:
        from prefect.utilities.processutils import command_from_string

        return [*command_from_string(command), "tests.warm_target", *module_args]

    def run(self, command: str, *module_args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(command, *module_args), cwd=self.cwd, env=self.env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def used(self) -> list[str]:
        return self.marks.read_text().split() if self.marks.exists() else []


@pytest.fixture
def worker(tmp_path: Path) -> _Worker:
    return _Worker(tmp_path)


def test_the_deploying_interpreter_runs_the_shim_where_it_exists(worker: _Worker) -> None:
    deploying = _wrapper(worker.root / "my venv" / "bin" / "python", "deploying", worker.marks)
    _wrapper(worker.bin / "python3", "python3", worker.marks)
    done = worker.run(portable_warm_command(str(deploying)), "exit", "7")
    assert done.returncode == 7, done.stderr  # the run's exit code, through sh's exec
    assert worker.used() == ["deploying"]  # a path with a space, quoted whole


def test_a_container_without_that_path_runs_python3_then_python(worker: _Worker) -> None:
    missing = "/opt/host-venv/bin/python"  # the host's venv: not on this worker
    _wrapper(worker.bin / "python3", "python3", worker.marks)
    _wrapper(worker.bin / "python", "python", worker.marks)
    done = worker.run(portable_warm_command(missing), "exit", "3")
    assert done.returncode == 3, done.stderr
    assert worker.used() == ["python3"]
    (worker.bin / "python3").unlink()
    done = worker.run(portable_warm_command(missing), "exit", "0")
    assert done.returncode == 0, done.stderr
    assert worker.used() == ["python3", "python"]


def test_no_interpreter_at_all_is_one_line_and_exit_127(worker: _Worker) -> None:
    worker.env["PATH"] = str(worker.bin)  # empty: no python3, no python
    done = worker.run(portable_warm_command("/opt/host-venv/bin/python"), "exit", "0")
    assert done.returncode == 127
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "collector: cannot start this flow run warm: neither /opt/host-venv/bin/python nor "
        "python3 nor python is on this worker (collector deploy --worker-python PATH or "
        "--cold-start; prefect.yaml: its warm_start definition)"
    ]


def test_the_shim_is_the_workers_child_and_gets_its_signals(worker: _Worker) -> None:
    """``exec``: no shell stays between the worker and the run, so the worker's SIGTERM (a
    cancel) reaches the run and its exit is the run's."""
    deploying = _wrapper(worker.root / "venv" / "bin" / "python", "deploying", worker.marks)
    facts = worker.root / "facts"
    running = subprocess.Popen(
        worker.argv(portable_warm_command(str(deploying)), "wait", str(facts)),
        cwd=worker.cwd, env=worker.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,  # its own group: nothing outlives the test
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not facts.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = json.loads(facts.read_text())
        assert seen["pid"] == running.pid  # the cold start runs in the worker's own child
        assert seen["cwd"] == str(worker.cwd)
        running.send_signal(signal.SIGTERM)
        assert running.wait(timeout=60) == 0
        assert Path(f"{facts}.term").exists()  # the run's own handler ran
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(running.pid, signal.SIGKILL)  # a shell left between: its child too
        running.communicate()


def test_warm_commands_need_an_absolute_interpreter_and_name_the_shim() -> None:
    from collector.errors import ConfigError

    for make in (warm_command, portable_warm_command):
        with pytest.raises(ConfigError, match="--worker-python python3: give the interpreter"):
            make("python3")
    assert warm_command("/opt/c/bin/python") == f"/opt/c/bin/python -m {WARM_MODULE}"
    portable = portable_warm_command()
    assert portable.startswith("/bin/sh -c ") and portable.endswith(f" {sys.executable}")


# --- deployments/prefect.yaml: its build step writes the same command ----------------------------
def test_prefect_yaml_build_step_is_warm_from_the_installed_checkout_and_cold_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.deploy import warm_start_step

    monkeypatch.chdir(ROOT)  # the checkout this Python imports Collector from
    assert warm_start_step() == {"command": portable_warm_command(sys.executable)}
    assert capsys.readouterr().out == ""
    monkeypatch.chdir(tmp_path)  # another folder: its flows are not the ones a zygote preloads
    assert warm_start_step() == {"command": None}
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("collector: these deployments' runs will start "
                                                 f"cold: {tmp_path.resolve()} is not")  # fmt: skip


def test_every_prefect_yaml_deployment_takes_the_build_steps_command() -> None:
    import yaml

    shipped = yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text(encoding="utf-8"))
    assert shipped["build"] == [WARM_BUILD_STEP]
    for entry in shipped["deployments"]:
        assert entry["work_pool"]["job_variables"] == {"command": WARM_FROM_BUILD_STEP}, entry
