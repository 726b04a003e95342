"""``current_task``: ``asyncio.current_task()`` without an interpreted frame on CPython 3.11.
Compiled with mypyc (``docs/development.md``: what that rules out).

On 3.11 ``asyncio.current_task`` is a Python function reading the C module's dict of running tasks per
loop; called from compiled code (``kvgate_core.native``) a few times per proxied request, its frame cost
more than the lookup. Compiled with the request path, this reads the same dict. From 3.12 the stdlib's
function is C and is used as it is.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Final

if sys.version_info >= (3, 12):
    current_task: Final = asyncio.current_task
else:
    #: the dict the C task implementation updates as each task steps (``_asyncio._current_tasks``)
    _RUNNING: Final[dict[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = vars(asyncio.tasks)[
        "_current_tasks"
    ]

    def current_task() -> asyncio.Task[Any] | None:
        """The task running on this thread's running loop (RuntimeError without one), as asyncio says."""
        return _RUNNING.get(asyncio.get_running_loop())
