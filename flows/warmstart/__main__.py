"""``<python> -m flows.warmstart``: the shim (flows/warmstart/shim.py), a worker's ``command``."""

import sys

from flows.warmstart.shim import main

sys.exit(main())
