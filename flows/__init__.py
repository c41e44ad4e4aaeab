"""Prefect flows and the `collector` command: thin orchestration over the `collector` engine.

Collector works offline. A flow called from plain Python with no Prefect server configured
makes Prefect start a temporary one in a subprocess, which inherits this environment: without
these defaults it tries to send usage telemetry (and logs "Failed to send telemetry" with no
network). The user's own settings win (setdefault).
"""

from __future__ import annotations

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
