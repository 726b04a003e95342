"""A deadline for a block of awaits, like ``asyncio.timeout``, that is cheap to push later.
Compiled with mypyc (``docs/development.md``: what that rules out).

A stream's idle deadline moves with every chunk. ``asyncio.Timeout.reschedule`` cancels its timer and
arms a new one each time: a ``TimerHandle`` (a Python object) pushed on the loop's heap with Python-level
comparisons, and one more cancelled handle left in the heap until the loop compacts it, ~3 µs a chunk.
``Deadline.reschedule`` to a later time only records it; the one armed timer, when it fires early, re-arms
for the recorded time. A stream then arms a timer about once per idle interval instead of once per chunk.

Entering a block arms a timer too; under uvloop that is a libuv timer started and stopped per block (~5%
of a proxied request's CPU). Deadlines given a ``DeadlineWheel`` share one timer instead: each sits in a
bucket of ``resolution_s`` (entering and leaving is a dict insert and delete), and the wheel's one timer
wakes for the earliest non-empty bucket. Such a deadline fires up to ``resolution_s`` late.

Expiry behaves as ``asyncio.timeout``'s: the task is cancelled, and on leaving the block the cancellation
becomes ``TimeoutError`` unless someone else cancelled the task too (then ``CancelledError`` goes on).
"""

from __future__ import annotations

import asyncio
import heapq
from types import TracebackType
from typing import Final

from kvgate_core.tasks import current_task

# states (plain ints: an Enum member lookup costs more than the rest of a check)
_CREATED: Final = 0
_ENTERED: Final = 1
_EXPIRING: Final = 2
_EXPIRED: Final = 3
_EXITED: Final = 4
_NAMES: Final = ("created", "entered", "expiring", "expired", "exited")


class Deadline:
    """``async with Deadline(delay_s) as d:`` raises ``TimeoutError`` out of the block ``delay_s`` seconds
    after it was entered, or at the last time given to ``d.reschedule``.

    Args:
        delay_s: seconds from entering the block.
        wheel: the shared timer to sit on (None: a timer of its own).
    """

    __slots__ = (
        "_bucket",
        "_cancelling",
        "_delay_s",
        "_handle",
        "_loop",
        "_state",
        "_task",
        "_wheel",
        "_when",
    )

    def __init__(self, delay_s: float, wheel: DeadlineWheel | None = None) -> None:
        self._delay_s = delay_s
        self._wheel = wheel
        self._bucket = 0
        self._state = _CREATED
        self._when = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[object] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancelling = 0

    def when(self) -> float:
        """The loop time at which the block is cancelled."""
        return self._when

    def expired(self) -> bool:
        """Whether the deadline passed (the block was cancelled for it)."""
        return self._state == _EXPIRING or self._state == _EXPIRED

    def reschedule(self, when: float) -> None:
        """Move the deadline to loop time ``when``: later costs an assignment, earlier re-arms the timer.

        Raises:
            RuntimeError: the block is not running (not entered yet, expired or left).
        """
        if self._state != _ENTERED:
            raise RuntimeError(f"cannot reschedule a deadline that is {_NAMES[self._state]}")
        if when < self._when and self._loop is not None:
            if self._wheel is not None:
                self._wheel.remove(self)
                self._when = when
                self._wheel.add(self, self._loop)
                return
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_at(when, self._on_timer)
        self._when = when

    async def __aenter__(self) -> Deadline:
        if self._state != _CREATED:
            raise RuntimeError("a deadline is entered once")
        task = current_task()
        if task is None:
            raise RuntimeError("a deadline is used inside a task")
        loop = asyncio.get_running_loop()
        self._task, self._loop = task, loop
        self._cancelling = task.cancelling()
        self._when = loop.time() + self._delay_s
        self._state = _ENTERED
        if self._wheel is not None:
            self._wheel.add(self, loop)
        else:
            self._handle = loop.call_at(self._when, self._on_timer)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._wheel is not None:
            self._wheel.remove(self)
        elif self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._state == _EXPIRING:
            self._state = _EXPIRED
            assert self._task is not None
            # only our own cancellation becomes TimeoutError; another one stands
            if (
                self._task.uncancel() <= self._cancelling
                and exc_type is not None
                and issubclass(exc_type, asyncio.CancelledError)
            ):
                raise TimeoutError from exc
        elif self._state == _ENTERED:
            self._state = _EXITED

    def _on_timer(self) -> None:
        self._handle = None
        if self._state != _ENTERED or self._loop is None or self._task is None:
            return
        if self._loop.time() < self._when:  # pushed later meanwhile
            self._handle = self._loop.call_at(self._when, self._on_timer)
            return
        self._state = _EXPIRING
        self._task.cancel()

    def _on_wheel(self, now: float) -> None:
        """Its bucket came due: expire, or (pushed later meanwhile) move to a later bucket."""
        if self._state != _ENTERED or self._task is None or self._loop is None:
            return
        if now < self._when:
            assert self._wheel is not None
            self._wheel.add(self, self._loop)
            return
        self._state = _EXPIRING
        self._task.cancel()


class DeadlineWheel:
    """One timer for many ``Deadline`` s of one event loop (see the module docstring).

    Args:
        resolution_s: bucket width; a deadline fires at most this late.
    """

    __slots__ = ("_armed", "_buckets", "_handle", "_heap", "_loop", "_resolution_s")

    def __init__(self, resolution_s: float = 0.01) -> None:
        if resolution_s <= 0:
            raise ValueError("resolution_s must be positive")
        self._resolution_s = resolution_s
        self._buckets: dict[int, dict[Deadline, None]] = {}
        self._heap: list[int] = []  # bucket numbers, maybe stale (emptied, or pushed twice)
        self._armed: int | None = None  # the bucket the timer is set for
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """Deadlines on the wheel."""
        return sum(map(len, self._buckets.values()))

    def add(self, deadline: Deadline, loop: asyncio.AbstractEventLoop) -> None:
        """Put an entered ``deadline`` in the bucket of its time.

        Raises:
            RuntimeError: deadlines of another event loop are still on the wheel.
        """
        if loop is not self._loop:
            if self._buckets and any(self._buckets.values()):
                raise RuntimeError("a deadline wheel serves one event loop at a time")
            self._reset(loop)
        number = int(deadline._when / self._resolution_s) + 1
        deadline._bucket = number
        bucket = self._buckets.get(number)
        if bucket is None:
            bucket = self._buckets[number] = {}
            heapq.heappush(self._heap, number)
            if self._armed is None or number < self._armed:
                self._arm(number, loop)
        bucket[deadline] = None

    def remove(self, deadline: Deadline) -> None:
        """Take ``deadline`` off the wheel (nothing if it is not on it)."""
        bucket = self._buckets.get(deadline._bucket)
        if bucket is not None:
            bucket.pop(deadline, None)
            if not bucket:
                del self._buckets[deadline._bucket]

    def _reset(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._loop, self._handle, self._armed = loop, None, None
        self._buckets.clear()
        self._heap.clear()

    def _arm(self, number: int, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._armed = number
        self._handle = loop.call_at(number * self._resolution_s, self._tick)

    def _tick(self) -> None:
        self._handle, self._armed = None, None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        heap, buckets = self._heap, self._buckets
        due: list[Deadline] = []
        while heap and heap[0] * self._resolution_s <= now:
            bucket = buckets.pop(heapq.heappop(heap), None)
            if bucket:
                due.extend(bucket)
        # drop stale numbers at the front so the timer is set for a bucket that holds deadlines
        while heap and heap[0] not in buckets:
            heapq.heappop(heap)
        for deadline in due:
            deadline._on_wheel(now)
        if heap and self._handle is None:
            self._arm(heap[0], loop)
