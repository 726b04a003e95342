"""``python -m kvgate``: the ``kvgate`` command."""

from kvgate.cli import main

raise SystemExit(main())
