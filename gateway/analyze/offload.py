"""Large request bodies parsed and analysed off the event loop, so one huge prompt never stalls the others.

Below ``inline_bytes`` (the common case: a chat turn is a few KB) a body is parsed, rendered, tokenized and
hashed on the loop, as before: a thread hop would cost more than the work. Above it:

1. a structural bound, checked in one C-level pass before any parsing: JSON objects and arrays (``{`` and
   ``[`` bytes, an upper bound that braces inside strings only raise) above ``max_containers`` is a 400.
   Parsing builds one Python object per container and orjson holds the GIL while it does (~1 µs each here:
   a 7.5 MB body of 250,000 messages held it 200-300 ms), so no thread can hide that cost from the loop;
2. the parse and the analysis run on this module's own thread (one by default: large prompts wait for each
   other, never for the loop's requests, and use at most one core between them); at most ``max_waiting``
   wait, more are refused at once with 503 (``Overloaded``). The analysis is pure Python and native
   tokenizers, which release the GIL between bytecodes and in Rust: the loop keeps answering.

``TokenizingAnalyzer`` is thread safe (its caches lock); ``Router.prepare`` reads no loop-owned state.
What stays on the loop (index lookups, recorded predictions) is bounded by ``--max-prefix-tokens``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

from gateway.errors import InvalidRequest, Overloaded
from gateway.settings import OffloadLimits

T = TypeVar("T")


class LargeBodyOffload:
    """Runs the parse and analysis of bodies above ``limits.inline_bytes`` on threads of its own."""

    def __init__(self, limits: OffloadLimits | None = None) -> None:
        self.limits = limits or OffloadLimits()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending = 0

    def is_large(self, raw: bytes) -> bool:
        return len(raw) > self.limits.inline_bytes

    def check_structure(self, raw: bytes) -> None:
        """Refuse a body with more JSON containers than ``max_containers`` (before it is parsed).

        Raises:
            InvalidRequest: too many.
        """
        limit = self.limits.max_containers
        if raw.count(b"{") + raw.count(b"[") > limit:
            raise InvalidRequest(
                f"the request body holds more than {limit} JSON objects and arrays", code="too_many_objects"
            )

    async def analysed(self, body: bytes, work: Callable[[], T]) -> T:
        """``work()`` (the parse and analysis of ``body``): on the loop for a small body; for a large one,
        after ``check_structure``, on the analysis thread (``run``).

        Raises:
            InvalidRequest: a large body with too many JSON containers.
            Overloaded: too many large bodies in progress.
        """
        if not self.is_large(body):
            return work()
        self.check_structure(body)
        return await self.run(work)

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` on the analysis thread; 503 when ``max_waiting`` large bodies already wait.

        Raises:
            Overloaded: too many large bodies in progress.
        """
        if self._pending >= self.limits.threads + self.limits.max_waiting:
            raise Overloaded("too many large prompts are being analysed; retry later", retry_after_s=1)
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.limits.threads, thread_name_prefix="kvgate-analyze"
            )
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self._pending -= 1

    def close(self) -> None:
        """Stop the threads (work not started is dropped; running work finishes on its own)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
