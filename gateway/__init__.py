"""The gateway. ``kvgate_core`` is imported first: its guard decides whether the compiled modules load."""

import kvgate_core  # noqa: F401
