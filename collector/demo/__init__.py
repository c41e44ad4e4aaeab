"""A local demo site with deliberate, configurable faults.

``collector demo`` runs against it so the demo needs no internet, and the integration tests use it
as "a real local HTTP server with faults". See :mod:`collector.demo.site`.
"""

from __future__ import annotations
