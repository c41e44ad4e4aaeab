"""A Prefect SQLite database already migrated, copied into a test's new ``PREFECT_HOME``.

Why: a Prefect server started on a new home first runs every Alembic migration of its
database: on this 2-core box (2026-12-06, load 3) 8.6 s of CPU to a healthy server on a new
SQLite file against 4.3 s on a migrated one. The tests that give each test (or module) a home
of its own, so that `collector` starts a local background server there, paid that each time.
The migrations run once instead (7 s of CPU, in a subprocess), into a file in the temporary
folder named by Prefect's version and migrations, kept for later sessions (the workers of one
session, and sessions at once, take a lock: one makes it, the others wait), and each such home
gets a copy.

What the product does is unchanged: the server starts on the copy exactly as on the database
a user's second start finds (Prefect checks the migrations, all applied, and serves).
tests/test_local_server.py's first test keeps a new home, so a first start on nothing is still
covered. Interrupted: the template is written to a temporary file renamed into place when
whole, under a lock; a killed session leaves at most that temporary file (removed when the
migration fails; a SIGKILL can leave it, named by its pid, never read), and the next session
makes the template again.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["seed_home"]

_MIGRATE = (
    "import asyncio\n"
    "from prefect.server.database import provide_database_interface\n"
    "asyncio.run(provide_database_interface().create_db())\n"
)


def _template() -> Path:
    """The migrated database of this Prefect (made by the first caller, under a lock).

    Kept in the temporary folder across sessions, named by Prefect's version and its SQLite
    migrations: another Prefect (or another migration) is another file, never a stale one.
    """
    import hashlib
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("prefect")
    assert spec is not None and spec.submodule_search_locations
    versions = Path(spec.submodule_search_locations[0], "server/database/_migrations/versions")
    migrations = sorted(path.name for path in (versions / "sqlite").glob("*.py"))
    identity = [importlib.metadata.version("prefect"), *migrations]
    key = hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir())
    path = folder / f"collector-tests-prefect-{key}.db"
    with open(folder / f"collector-tests-prefect-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other workers wait for the one making it
        if not path.exists():
            partial = folder / f"collector-tests-prefect-{key}.{os.getpid()}.db"
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{partial}"
            try:
                subprocess.run(
                    [sys.executable, "-c", _MIGRATE], env=env, check=True, capture_output=True,
                    timeout=600,
                )  # fmt: skip
                _copy(partial, path)  # one file, the write-ahead log folded in
            finally:
                for leftover in folder.glob(f"{partial.name}*"):
                    leftover.unlink()
    return path


def _copy(source: Path, target: Path) -> None:
    """``source`` whole into ``target`` (SQLite's backup: nothing left in a -wal file)."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    with sqlite3.connect(source) as src, sqlite3.connect(partial) as dst:
        src.backup(dst)
    src.close()
    dst.close()
    partial.replace(target)


def seed_home(home: Path, *, python: str | None = None) -> Path:
    """Give ``home`` the migrated Prefect database of an install's local background server
    (flows/local_server.py's ``state_folder``, where `collector` starts one) and of an
    ephemeral server (``prefect.db``). The install is this interpreter's, or ``python``'s (its
    own ``sys.prefix``, its own folder: that interpreter is asked). Returns ``home``."""
    from flows import local_server

    key = local_server.install_key()
    if python is not None:
        key = subprocess.run(
            [python, "-c", "from flows.local_server import install_key; print(install_key())"],
            cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True, text=True,
            timeout=120,
        ).stdout.strip()  # fmt: skip
    template = _template()
    folder = home / "collector-servers" / key
    for database in (home / "prefect.db", folder / "prefect.db"):
        if not database.exists():
            database.parent.mkdir(parents=True, exist_ok=True)
            _copy(template, database)
    return home
