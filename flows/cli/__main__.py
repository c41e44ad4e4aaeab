"""``python -m flows.cli``: the ``collector`` command."""

from flows.cli import main

raise SystemExit(main())
