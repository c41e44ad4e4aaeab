"""Prefect concurrency leases of the local server, kept on disk beside its database.

Prefect's default lease storage is memory: a server that stops (``collector server stop``, a
Prefect upgrade, a reboot, a crash) forgets every lease, while the slots those leases took stay
counted in its database. A ``domain:<host>`` slot held by a run that died with the server (a
reboot mid-run: the run SIGKILLed, the server gone) was then held for good: no lease left for
the repossessor to expire, every later batch on that host waited ``DOMAIN_LOCK_WAIT_S`` and
failed. On disk, a lease outlives its server; the repossessor of the next one expires it and
gives its slots back (``tests/test_domain_slot_recovery.py``).

Prefect's own file storage keeps every lease in ``$PREFECT_HOME/concurrency_leases``, one
folder for any server of that home: a server of another install (its own database) would see
these leases as its own expired ones and revoke them. The folder here is the install's state
folder, named by the local server's environment (``flows/local_server.py``), beside the
database the leases count slots of.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect.server.concurrency.lease_storage.filesystem import (
    ConcurrencyLeaseStorage as _FileLeaseStorage,
)

__all__ = ["LEASES_FOLDER_VARIABLE", "MODULE", "ConcurrencyLeaseStorage"]

MODULE = __name__  # what PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE names
LEASES_FOLDER_VARIABLE = "COLLECTOR_LEASES_FOLDER"


class ConcurrencyLeaseStorage(_FileLeaseStorage):
    """Prefect's file lease storage, in the folder the server's environment names."""

    def __init__(self, storage_path: Path | None = None) -> None:
        folder = os.environ.get(LEASES_FOLDER_VARIABLE)
        super().__init__(storage_path or (Path(folder) if folder else None))
